"""Time the Pallas FP4 matmuls (W4A16) against a bf16 jnp.dot and the XLA dequantize-then-dot path.

    python benchmarks/fp4_matmul.py --out fp4_matmul.json [--fmt nvfp4] [--iters 20]
        [--impls bf16_dot,xla_dequant_dot,pallas_fp4_float32,pallas_fp4_bfloat16,mosaic_fp4] [--m 1,16,128]

GPU: M in {1, 16, 128} by default, K = N = 8192 (the issue's shapes). CPU: a small shape in
interpret mode, which checks that the script runs but is NOT a speed measurement.
Prints a table and writes the rows (times, bytes moved, achieved GB/s, speed-up vs bf16,
fraction of the measured copy bandwidth, TFLOP/s, and for the FP4 kernels the max error relative
to the dequantize-then-dot reference's max |value|: the outputs are bf16, so about 2e-3 is the
rounding floor) as JSON to --out. ``mosaic_fp4`` (the Mosaic
GPU kernel, never run on a GPU before) is not in the default list: gpu_check.sh runs it in a step
of its own.
"""
import argparse
import datetime
import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.timing import copy_bandwidth, time_fn
from pallas_kernels import fp4

GPU_SHAPES = [(1, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192)]  # (M, K, N); one K and N per list
CPU_SHAPES = [(1, 256, 256), (16, 256, 256)]
DEFAULT_IMPLS = "bf16_dot,xla_dequant_dot,pallas_fp4_float32,pallas_fp4_bfloat16"




def make_weight(k, n, fmt):
    w = jnp.asarray(np.random.default_rng(0).standard_normal((k, n)) / np.sqrt(k), jnp.bfloat16)
    return w, fp4.quantize(w, fmt, axis=0)


def bench_shape(m, w, qw, iters, interpret, copy_bw, impls):
    """Rows for one M; an implementation that fails (e.g. a kernel that does not compile) gets an error row."""
    k, n = w.shape
    x = jnp.asarray(np.random.default_rng(m).standard_normal((m, k)), jnp.bfloat16)
    io_bytes = x.size * 2 + m * n * 2
    candidates = {
        "bf16_dot": (jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)),
                     (x, w), w.size * 2 + io_bytes),
        "xla_dequant_dot": (jax.jit(lambda a, q: fp4.fp4_matmul_reference(a, q)), (x, qw), qw.nbytes + io_bytes),
        "mosaic_fp4": (jax.jit(lambda a, q: fp4.fp4_matmul_mosaic(a, q)), (x, qw),
                       qw.nbytes + io_bytes),
    }
    for precision in ("float32", "bfloat16"):
        fn = jax.jit(lambda a, q, p=precision: fp4.fp4_matmul(a, q, interpret=interpret, precision=p))
        candidates[f"pallas_fp4_{precision}"] = (fn, (x, qw), qw.nbytes + io_bytes)
    ref = np.asarray(fp4.fp4_matmul_reference(x, qw, out_dtype=jnp.float32))
    rows, t_bf16 = [], None
    for name in impls:
        fn, args, nbytes = candidates[name]
        row = {"impl": name, "fmt": qw.fmt, "M": m, "K": k, "N": n, "bytes": nbytes}
        try:
            t = time_fn(fn, *args, iters=iters)
            if name != "bf16_dot":
                out = np.asarray(fn(*args), np.float32)
                row["max_rel_err"] = float(np.abs(out - ref).max() / np.abs(ref).max())
        except Exception as e:  # noqa: BLE001 -- report and go on to the next implementation
            rows.append({**row, "error": f"{type(e).__name__}: {str(e)[:400]}"})
            continue
        t_bf16 = t if name == "bf16_dot" else t_bf16
        rows.append({**row, "time_us": t * 1e6, "GBps": nbytes / t / 1e9,
                     "speedup_vs_bf16": (t_bf16 / t) if t_bf16 else float("nan"),
                     "frac_of_copy_bw": nbytes / t / copy_bw, "tflops": 2 * m * k * n / t / 1e12})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON results here")
    parser.add_argument("--fmt", default="nvfp4", choices=["nvfp4", "mxfp4"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--impls", default=DEFAULT_IMPLS, help="comma-separated, bf16_dot first for the ratios")
    parser.add_argument("--m", help="comma-separated M values (default: the shape list's)")
    args = parser.parse_args(argv)
    impls = args.impls.split(",")
    backend = jax.default_backend()
    on_gpu = backend == "gpu"
    interpret = not on_gpu
    copy_bw = copy_bandwidth((1 << 30) if on_gpu else (1 << 24), args.iters)
    shapes = GPU_SHAPES if on_gpu else CPU_SHAPES
    if args.m:
        shapes = [(int(m), shapes[0][1], shapes[0][2]) for m in args.m.split(",")]
    w, qw = make_weight(shapes[0][1], shapes[0][2], args.fmt)  # all shapes share K and N
    rows = [r for m, _, _ in shapes for r in bench_shape(m, w, qw, args.iters, interpret, copy_bw, impls)]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "jax_version": jax.__version__, "backend": backend, "device": jax.devices()[0].device_kind,
        "interpret": interpret, "copy_bandwidth_GBps": copy_bw / 1e9, "rows": rows,
        "note": ("Pallas interpret mode on CPU: correctness only, not a speed measure." if interpret
                 else "compiled Pallas kernel; bytes = weights (+scales) + x + out."),
    }
    print(f"# {result['device']} ({backend}), jax {jax.__version__}, copy bw {copy_bw / 1e9:.1f} GB/s"
          f"{' -- INTERPRET MODE, NOT A SPEED MEASURE' if interpret else ''}")
    print(f"{'impl':22} {'M':>4} {'K':>6} {'N':>6} {'time_us':>10} {'GB/s':>8} {'x bf16':>7} {'%copy':>6} {'rel err':>8}")
    for r in rows:
        head = f"{r['impl']:22} {r['M']:4d} {r['K']:6d} {r['N']:6d}"
        if "error" in r:
            print(f"{head} FAILED {r['error'][:200]}")
            continue
        print(f"{head} {r['time_us']:10.1f} {r['GBps']:8.1f} {r['speedup_vs_bf16']:7.2f} {100 * r['frac_of_copy_bw']:6.1f}"
              f" {r.get('max_rel_err', float('nan')):8.1e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
