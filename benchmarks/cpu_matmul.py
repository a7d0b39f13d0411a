"""Weight-streaming speed of the CPU FFI matmuls (jaxserve/kernels/cpu) against XLA's dot, on SmolLM2's shapes.

    python benchmarks/cpu_matmul.py [--m 1,2,16] [--threads 1,2] [--iters 15] [--paths xla_f32,kernel_f32]
                                    [--out cpu_matmul.json]

Each timed call runs one matmul over R distinct weights in a chain (R x weight bytes >= 96 MB, more
than the L3), as a decode step runs 30 layers' weights, so the weights come from memory, not cache.
The paths of one shape and M are timed interleaved, call by call (a busy, shared machine slows them alike).
Reported: median microseconds per matmul, the weight bytes read per second (GB/s) and GFLOP/s (2 M K N per matmul).
Paths: xla_f32 (float32 weights, XLA's dot), kernel_f32_t<threads> (``f32_matmul``), blas_f32_t<threads>
(``f32_gemm``: OpenBLAS sgemm, one OpenBLAS thread, N split over <threads> XLA pool threads), blas_f32_ob2 (``f32_gemm``
with threads=1 and OpenBLAS's own 2 threads), xla_bf16
(``jaxserve.layers.dot_via(bfloat16)``: what a bf16 model runs without the kernel), kernel_bf16_t<threads>,
amx_bf16_t<threads> (``bf16_gemm``: AMX tiles, on a CPU that has them), amxpacked_bf16_t<threads>
(``bf16_gemm_packed``: AMX tiles on a Dense kernel packed once, ``jaxserve.kernels.cpu.packed``), and with
--fp4: xla_<fmt> (dequantize, then dot: ``fp4_matmul_reference``) and kernel_<fmt>_t<threads> (the tied head:
quantized along K, ``fp4_matmul_cpu``'s [N, K] kernel). --paths keeps those
whose name starts with one of its prefixes.
"""
import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

os.environ.setdefault("JAXSERVE_CPU_KERNELS", "1")
from jaxserve.kernels.cpu import matmul as cpu  # noqa: E402
from jaxserve.kernels.cpu.packed import bf16_gemm_packed, pack_bf16  # noqa: E402
from jaxserve.layers import dot_via  # noqa: E402
from pallas_kernels.fp4 import dequantize, fp4_matmul_reference, quantize  # noqa: E402

SHAPES = {"q/o [576,576]": (576, 576), "k/v [576,192]": (576, 192), "gate/up [576,1536]": (576, 1536),
          "down [1536,576]": (1536, 576), "tied head [49152,576]^T": (576, 49152)}
DN = (((1,), (0,)), ((), ()))


def chain(mm):
    """One jitted call applying mm(x, w_r) for every weight, each x depending on the last output."""
    def run(x, ws):
        for w in ws:
            y = mm(x, w)
            x = x + 0.0 * y[:, :1].astype(x.dtype)
        return x
    return jax.jit(run)


def timed(fns, x, iters):
    """{path: (fn, ws, before)} -> {path: (median, min, max) seconds per matmul}, the paths alternating call by call;
    ``before()`` runs ahead of each of its path's calls (e.g. setting OpenBLAS's threads)."""
    for fn, ws, before in fns.values():
        before()
        jax.block_until_ready(fn(x, ws))
    times = {p: [] for p in fns}
    for _ in range(iters):
        for p, (fn, ws, before) in fns.items():
            before()
            t = time.perf_counter()
            jax.block_until_ready(fn(x, ws))
            times[p].append((time.perf_counter() - t) / len(ws))
    return {p: (np.median(ts), min(ts), max(ts)) for p, ts in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--fp4", default="nvfp4,mxfp4")
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))))
    ap.add_argument("--paths", default="", help="comma-separated name prefixes of the paths to time (default: all)")
    ap.add_argument("--out")
    a = ap.parse_args()
    assert cpu.usable(), "CPU kernels unavailable"
    rng = np.random.default_rng(0)
    rows, names = [], list(SHAPES)
    for si in map(int, a.shapes.split(",")):
        name = names[si]
        k, n = SHAPES[name]
        head = "head" in name
        reps = max(2, min(150, math.ceil(96e6 / (2 * k * n))))
        wf = [jnp.asarray(rng.standard_normal((n, k) if head else (k, n)) * 0.02, jnp.float32) for _ in range(reps)]
        wb = [w.astype(jnp.bfloat16) for w in wf]
        wp = [pack_bf16(w) for w in wb] if cpu.amx_usable() and not head else []
        paths = {"xla_f32": (wf, lambda x, w: jnp.dot(x, w.T if head else w), 4),
                 "xla_bf16": (wb, lambda x, w: dot_via(jnp.bfloat16)(x.astype(jnp.bfloat16), w.T if head else w,
                                                                     DN), 2)}
        for t in map(int, a.threads.split(",")):
            paths[f"kernel_f32_t{t}"] = (wf, lambda x, w, t=t: cpu.f32_matmul(x, w, transpose_w=head, threads=t), 4)
            paths[f"blas_f32_t{t}"] = (wf, lambda x, w, t=t: cpu.f32_gemm(x, w, transpose_w=head, threads=t), 4)
            paths[f"kernel_bf16_t{t}"] = (wb, lambda x, w, t=t: cpu.bf16_matmul(x, w, transpose_w=head, threads=t), 2)
            if cpu.amx_usable():
                paths[f"amx_bf16_t{t}"] = (wb, lambda x, w, t=t: cpu.bf16_gemm(x, w, transpose_w=head, threads=t), 2)
                if not head:
                    paths[f"amxpacked_bf16_t{t}"] = (wp, lambda x, w, t=t: bf16_gemm_packed(x, w, threads=t), 2)
        paths["blas_f32_ob2"] = (wf, lambda x, w: cpu.f32_gemm(x, w, transpose_w=head, threads=1), 4)
        if a.fp4:  # the head: the tied embedding quantized along K (axis 1), read by the [N, K] kernel
            for fmt in a.fp4.split(","):
                wq = [quantize(w, fmt, axis=1 if head else 0) for w in wf]
                nb = wq[0].nbytes
                paths[f"xla_{fmt}"] = (wq, (lambda x, w: x @ dequantize(w, jnp.float32).T) if head
                                       else (lambda x, w: fp4_matmul_reference(x, w)), nb / (k * n))
                for t in map(int, a.threads.split(",")):
                    paths[f"kernel_{fmt}_t{t}"] = (wq, lambda x, w, t=t: cpu.fp4_matmul_cpu(x, w, threads=t),
                                                   nb / (k * n))
        if a.paths:
            paths = {p: v for p, v in paths.items() if p.startswith(tuple(a.paths.split(",")))}
        blas = cpu.build.load_blas() if any(p.startswith("blas") for p in paths) else None
        for m in map(int, a.m.split(",")):
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
            # OpenBLAS's thread count is global: 2 for blas_f32_ob2, back to 1 (load_blas's setting) for the rest
            fns = {p: (chain(mm), ws, (lambda p=p: blas.scipy_openblas_set_num_threads(2 if p.endswith("ob2") else 1))
                       if blas else (lambda: None)) for p, (ws, mm, _) in paths.items()}
            for path, (med, lo, hi) in timed(fns, x, a.iters).items():
                gbs, gflops = paths[path][2] * k * n / med / 1e9, 2 * m * k * n / med / 1e9
                rows.append(dict(shape=name, m=m, path=path, us=med * 1e6, us_min=lo * 1e6, us_max=hi * 1e6,
                                 weight_gb_s=gbs, gflop_s=gflops))
                print(f"{name:26s} M={m:<3d} {path:18s} {med * 1e6:9.1f} us  [{lo * 1e6:.1f}-{hi * 1e6:.1f}]"
                      f"  {gbs:6.1f} GB/s {gflops:6.1f} GFLOP/s", flush=True)
            if blas:
                blas.scipy_openblas_set_num_threads(1)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"load": os.getloadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
