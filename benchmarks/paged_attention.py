"""Time decode attention over a paged KV cache: Pallas kernel vs gather-then-attend reference vs
attention over a contiguous (non-paged) cache of the same lengths.

    python benchmarks/paged_attention.py --out paged_attention.json [--grid small|gpu]
        [--impls pallas,xla,reference,contiguous[,mosaic]] [--dtype bfloat16] [--iters 20]

Bandwidth = bytes of K/V the sequences hold (B * context * Hkv * D * 2 * itemsize) / time, and
as a fraction of the device's measured copy bandwidth (bytes read + written / time of a copy).
On CPU the default is a small grid with the reference and the contiguous path only: the Pallas
kernel runs there in interpret mode, which is a correctness tool, not a speed measurement.
"mosaic" (GPU only, opt-in) times the experimental, hardware-unverified Mosaic GPU kernel.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.timing import copy_bandwidth, time_fn
from pallas_kernels.paged_attention import (
    paged_attention,
    paged_attention_mosaic,
    paged_attention_online,
    paged_attention_reference,
)

# (batch, context, q heads, kv heads, head dim, block size)
GRIDS = {
    "small": [
        (8, 512, 8, 2, 64, 16),
        (32, 512, 8, 8, 64, 16),
        (4, 2048, 32, 8, 128, 16),
        (16, 1024, 32, 8, 128, 16),
        (16, 1024, 32, 8, 128, 64),
    ],
    "gpu": [
        (64, 4096, 32, 8, 128, 16),  # the goal shape
        (64, 4096, 32, 8, 128, 32),
        (64, 4096, 32, 8, 128, 64),
        (64, 4096, 32, 32, 128, 16),
        (64, 4096, 32, 4, 128, 16),
        (8, 4096, 32, 8, 128, 16),
        (1, 32768, 32, 8, 128, 16),  # small batch, long context: split-k must fill the GPU
        (128, 2048, 64, 8, 128, 16),
        (64, 4096, 16, 8, 64, 16),
        (32, 4096, 16, 8, 256, 16),
    ],
}




def contiguous_attention(q, k, v, lengths):
    """q [B, H, D], k/v [B, L, K, D] dense per sequence, masked past lengths: the non-paged peer."""
    b, h, d = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(b, kv_heads, h // kv_heads, d)
    s = jnp.einsum("bkgd,blkd->bkgl", qg, k, preferred_element_type=jnp.float32) * d ** -0.5
    mask = jnp.arange(k.shape[1])[None, :] < lengths[:, None]
    s = jnp.where(mask[:, None, None, :], s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkgl,blkd->bkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(b, h, d).astype(q.dtype)


def make_inputs(batch, context, heads, kv_heads, head_dim, block, dtype, seed=0):
    """Paged pool with each sequence's pages scattered at random, plus the same K/V contiguous."""
    rng = np.random.default_rng(seed)
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    pages = -(-context // block)
    dense_shape = (batch, pages * block, kv_heads, head_dim)
    k_dense = jax.random.normal(kk, dense_shape, dtype)
    v_dense = jax.random.normal(kv, dense_shape, dtype)
    perm = rng.permutation(batch * pages)
    tables = perm.reshape(batch, pages).astype(np.int32)
    inverse = np.argsort(perm)  # physical page -> logical (sequence, page) slot

    def to_pool(dense):
        logical = dense.reshape(batch * pages, block, kv_heads, head_dim)
        return logical[jnp.asarray(inverse)]

    q = jax.random.normal(kq, (batch, heads, head_dim), dtype)
    lengths = jnp.full((batch,), context, jnp.int32)
    return dict(q=q, k_pages=to_pool(k_dense), v_pages=to_pool(v_dense),
                tables=jnp.asarray(tables), lengths=lengths, k=k_dense, v=v_dense)


def bench_config(cfg, impls, dtype, iters, copy_bw, interpret):
    batch, context, heads, kv_heads, head_dim, block = cfg
    x = make_inputs(*cfg, dtype)
    kv_bytes = 2 * batch * context * kv_heads * head_dim * jnp.dtype(dtype).itemsize
    paged = (x["q"], x["k_pages"], x["v_pages"], x["tables"], x["lengths"])
    runs = {
        "pallas": (jax.jit(lambda *a: paged_attention(*a, interpret=interpret)), paged),
        "reference": (jax.jit(paged_attention_reference), paged),
        "xla": (jax.jit(paged_attention_online), paged),
        "mosaic": (jax.jit(paged_attention_mosaic), paged),
        "contiguous": (jax.jit(contiguous_attention), (x["q"], x["k"], x["v"], x["lengths"])),
    }
    rows = []
    for impl in impls:
        fn, args = runs[impl]
        seconds = time_fn(fn, *args, iters=iters)
        rows.append(dict(batch=batch, context=context, heads=heads, kv_heads=kv_heads,
                         head_dim=head_dim, block_size=block, dtype=jnp.dtype(dtype).name,
                         impl=impl, interpret=interpret if impl == "pallas" else None,
                         time_ms=seconds * 1e3, kv_bytes=kv_bytes, gb_per_s=kv_bytes / seconds / 1e9,
                         pct_copy_bw=100 * kv_bytes / seconds / copy_bw))
    by_impl = {r["impl"]: r["time_ms"] for r in rows}
    for r in rows:
        if "contiguous" in by_impl:
            r["vs_contiguous"] = r["time_ms"] / by_impl["contiguous"]
    return rows


def print_table(rows):
    print(f"{'B':>4} {'ctx':>6} {'H/K':>6} {'D':>4} {'S':>4} {'impl':>11} {'ms':>9} {'GB/s':>8} "
          f"{'%copy':>6} {'x contig':>8}")
    for r in rows:
        print(f"{r['batch']:>4} {r['context']:>6} {r['heads']:>3}/{r['kv_heads']:<2} "
              f"{r['head_dim']:>4} {r['block_size']:>4} {r['impl']:>11} {r['time_ms']:>9.3f} "
              f"{r['gb_per_s']:>8.1f} {r['pct_copy_bw']:>6.1f} {r.get('vs_contiguous', float('nan')):>8.2f}")


def main(argv=None):
    on_gpu = jax.default_backend() == "gpu"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="gpu" if on_gpu else "small")
    parser.add_argument("--impls", default="pallas,xla,reference,contiguous" if on_gpu
                        else "xla,reference,contiguous")
    parser.add_argument("--dtype", default="bfloat16" if on_gpu else "float32")
    parser.add_argument("--iters", type=int, default=20 if on_gpu else 5)
    parser.add_argument("--limit", type=int, default=None, help="only the first N grid entries")
    parser.add_argument("--copy-mib", type=int, default=1024 if on_gpu else 256)
    args = parser.parse_args(argv)
    impls = args.impls.split(",")
    interpret = not on_gpu
    if "pallas" in impls and interpret:
        print("note: pallas runs in interpret mode here; its time is not a speed measurement",
              file=sys.stderr)

    copy_bw = copy_bandwidth(args.copy_mib << 20, args.iters)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}); "
          f"copy bandwidth {copy_bw / 1e9:.1f} GB/s (read + written)")
    rows = []
    for cfg in GRIDS[args.grid][:args.limit]:
        rows += bench_config(cfg, impls, jnp.dtype(args.dtype), args.iters, copy_bw, interpret)
    print_table(rows)
    if args.out:
        meta = dict(date=datetime.date.today().isoformat(), jax=jax.__version__,
                    backend=jax.default_backend(), device=jax.devices()[0].device_kind,
                    command=" ".join(["python", *sys.argv]), copy_bw_gb_per_s=copy_bw / 1e9,
                    grid=args.grid, dtype=args.dtype, iters=args.iters)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
