"""The CPU paged-attention kernel alone on SmolLM2-135M's decode shapes at batch 64, where its pages lie: a pool of a
few MB that stays in cache, and one the size of a serving pool whose pages are scattered, as the engine's 30 layers
read them (each call one layer's tables, 30 tables rotating over disjoint random pages, so nothing is reused from
cache between calls).

    python benchmarks/cpu_attention_pool.py [--pool-pages 4096,131072] [--rounds 5] [--engine-rounds 3]
                                            [--batch 64] [--contexts 64,192] [--out results.json]

Pools of bf16 bits (the engine's for a bf16 model), 9 query heads, 3 kv heads, head dim 64, pages of 16 tokens,
contexts 64-192 (the batch-64 workload's; ``--batch 8 --contexts 300,1000``: a ShareGPT run's tail, few sequences
with long contexts). Reported per call: best and median of the rounds' means (ms), and the K/V
bytes the call must read over the best time. ``--engine-rounds N``: then SmolLM2-135M-Instruct bfloat16 in the engine,
64 requests of 64 -> 128 tokens (``benchmarks/cpu_blas_ab.py``'s batch64), N timed runs after a warm-up: output tok/s. To compare two builds of the kernel, run it on each source (``git checkout REV --
jaxserve/kernels/cpu/attention.cc``): the kernels are rebuilt when attention.cc changes, and the record names the
source's hash.
"""
import argparse
import datetime
import hashlib
import json
import os
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.throughput import git_commit, machine
from jaxserve.kernels.cpu.attention import paged_attention_cpu

SOURCE = pathlib.Path(__file__).resolve().parents[1] / "jaxserve/kernels/cpu/attention.cc"
BATCH, HEADS, KV_HEADS, HEAD_DIM, PAGE, LAYERS = 64, 9, 3, 64, 16, 30


def bench(pool_pages: int, rounds: int, batch: int = BATCH, contexts: tuple[int, int] = (64, 192)) -> dict:
    rng = np.random.default_rng(0)
    width = 1024 // PAGE
    lens = rng.integers(contexts[0], contexts[1] + 1, batch).astype(np.int32)
    if pool_pages >= LAYERS * batch * width:  # each layer's pages its own
        ids = rng.permutation(pool_pages)[:LAYERS * batch * width].reshape(LAYERS, batch, width)
    else:  # a small pool: pages shared between layers (and cached)
        ids = rng.integers(0, pool_pages, (LAYERS, batch, width))
    tables = [jnp.asarray(t.astype(np.int32)) for t in ids]
    one = 0x3E00  # bf16 bits of 0.125: the values do not change the work
    kt = jnp.full((pool_pages, KV_HEADS, HEAD_DIM, PAGE), one, jnp.uint16)
    v = jnp.full((pool_pages, PAGE, KV_HEADS, HEAD_DIM), one, jnp.uint16)
    q = jnp.asarray(rng.standard_normal((batch, HEADS, HEAD_DIM)).astype(np.float32))
    f = jax.jit(paged_attention_cpu)
    f(q, kt, v, tables[0], lens).block_until_ready()
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(2 * LAYERS):
            out = f(q, kt, v, tables[i % LAYERS], lens)
        out.block_until_ready()
        means.append((time.perf_counter() - t0) / (2 * LAYERS) * 1e3)
    kv_bytes = int(lens.sum()) * KV_HEADS * HEAD_DIM * 2 * 2
    row = dict(batch=batch, contexts=list(contexts), pool_pages=pool_pages, pool_mib=2 * kt.nbytes / 2**20,
               best_ms=min(means), median_ms=statistics.median(means), kv_mb=kv_bytes / 1e6,
               gb_s=kv_bytes / min(means) / 1e6)
    print(f"pool {row['pool_mib']:7.0f} MiB  {row['best_ms']:.3f} ms/call (median {row['median_ms']:.3f})"
          f"  {row['kv_mb']:.2f} MB K/V -> {row['gb_s']:.1f} GB/s", flush=True)
    return row


def bench_engine(rounds: int) -> dict:
    from jaxserve.bench.backends import BenchModel, BenchOptions, JaxserveBackend
    from jaxserve.bench.throughput import load_model
    from jaxserve.bench.workload import make_workload

    with tempfile.TemporaryDirectory() as tmp:
        model = load_model("smollm2-135m-instruct", 0, tmp)
        requests = make_workload("fixed", 64, model.config.vocab_size, 1024, 0, input_len=(64, 64),
                                 output_len=(128, 128))
        engine = JaxserveBackend(BenchModel(model.name, model.config, model.params, model.tokenizer, tmp),
                                 BenchOptions(dtype="bfloat16", max_model_len=1024))
        engine.run(requests)  # warm-up: every shape compiled
        tok_s = []
        for _ in range(rounds):
            out = engine.run(requests)
            tok_s.append(out["output_tokens"] / out["elapsed_s"])
            print(f"engine batch64 bf16 {tok_s[-1]:.1f} tok/s", flush=True)
    return dict(workload="batch64", dtype="bfloat16", tok_s=statistics.median(tok_s), tok_s_range=[min(tok_s),
                max(tok_s)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool-pages", default="4096,131072")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engine-rounds", type=int, default=0)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--contexts", default="64,192", help="LO,HI: each sequence's context length drawn from [LO, HI]")
    ap.add_argument("--out")
    a = ap.parse_args()
    contexts = tuple(int(c) for c in a.contexts.split(","))
    rows = [bench(int(p), a.rounds, a.batch, contexts) for p in a.pool_pages.split(",")]
    engine = [bench_engine(a.engine_rounds)] if a.engine_rounds else []
    meta = {"command": "python benchmarks/cpu_attention_pool.py " + " ".join(os.sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
            "git_commit": git_commit(pathlib.Path(__file__).parent), "jax_version": jax.__version__,
            # the kernel's source as built (a run on an older attention.cc checked out names it here)
            "attention_cc_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}
    if a.out:
        pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.out).write_text(json.dumps({"meta": meta, "results": rows, "engine": engine}, indent=1))


if __name__ == "__main__":
    main()
