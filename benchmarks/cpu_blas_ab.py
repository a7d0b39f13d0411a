"""End to end A/B of the CPU GEMM paths in one process: the float32 GEMM (``jaxserve.kernels.cpu.f32_gemm``,
OpenBLAS) and the bf16 one on AMX tiles (``jaxserve.kernels.cpu.bf16_gemm``).

    python benchmarks/cpu_blas_ab.py [--model smollm2-135m-instruct] [--dtype float32] [--workloads batch64,batch1,prefill]
                                     [--variants blas,xla] [--rounds 5] [--out ab.json]

Variants (each an engine of its own, built and warmed up with its setting, so every shape is compiled before the
timed runs; a run that compiles anything is reported): ``blas`` (the default: OpenBLAS, one OpenBLAS thread,
N split over XLA's pool), ``xla`` (``JAXSERVE_CPU_BLAS=0``: XLA's dot above 16 rows), ``blas1`` (one OpenBLAS
thread, no split) and ``ob2`` (OpenBLAS's own two threads, no split); with ``--dtype bfloat16``: ``amx`` (the default
on a CPU with AMX tiles) and ``noamx`` (``JAXSERVE_CPU_AMX=0``: bf16_matmul up to 16 rows, XLA's dot above), ``bf16kv``
(the default: a bf16 model's KV pool holds bf16 bits where the C++ attention kernel reads it) and ``f32kv`` (that
pool in float32, as before). The engines share the model's jitted step
programs, whose cache key is the static config and not the switch, so each variant's config differs in a field the
model does not read (``rope_original_max_position``, used by llama3 RoPE only: the models here use the default).
Rounds alternate the variants (the order rotated each round); reported: output tokens/s median and range.
Workloads: ``batch64`` (64 requests, 64 -> 128 tokens, as benchmarks/peers/compare.py), ``batch1`` (one such
request) and ``prefill`` (16 requests, 512 -> 4 tokens: mostly prefill).
"""
import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp

from jaxserve.bench.backends import BenchModel, BenchOptions, JaxserveBackend
from jaxserve.bench.throughput import git_commit, load_model, machine
from jaxserve.bench.workload import make_workload
from jaxserve.kernels import cpu
from jaxserve.models.attention_backends import XlaAttention
from jaxserve.kernels.cpu import build

# variant -> (environment, f32_gemm's threads (None: the default), OpenBLAS's threads)
VARIANTS = {"blas": ({cpu.matmul.BLAS_SWITCH: "1"}, None, 1), "xla": ({cpu.matmul.BLAS_SWITCH: "0"}, None, 1),
            "blas1": ({cpu.matmul.BLAS_SWITCH: "1"}, 1, 1), "ob2": ({cpu.matmul.BLAS_SWITCH: "1"}, 1, 2),
            "amx": ({cpu.matmul.AMX_SWITCH: "1"}, None, 1), "noamx": ({cpu.matmul.AMX_SWITCH: "0"}, None, 1),
            "bf16kv": ({}, None, 1), "f32kv": ({}, None, 1)}
# variants whose KV pools are float32 whatever the model's dtype (XlaAttention.storage_dtype while their engine is built)
F32_POOLS = {"f32kv"}
WORKLOADS = {"batch64": (64, 64, 128), "batch1": (1, 64, 128), "prefill": (16, 512, 4)}  # requests, in, out


@contextlib.contextmanager
def variant(name):
    """The variant's environment, GEMM threads (at trace time) and OpenBLAS threads (at run time)."""
    env, gemm_threads, ob_threads = VARIANTS[name]
    saved_env, saved_gemm, saved_pools = {k: os.environ.get(k) for k in env}, cpu.f32_gemm, XlaAttention.storage_dtype
    os.environ.update(env)
    if name in F32_POOLS:
        XlaAttention.storage_dtype = lambda self, dtype: jnp.dtype(jnp.float32)
    if gemm_threads is not None:
        cpu.f32_gemm = lambda x, w, transpose_w=False, threads=None: saved_gemm(x, w, transpose_w=transpose_w,
                                                                                threads=gemm_threads)
    blas = build.load_blas()
    if blas:
        blas.scipy_openblas_set_num_threads(ob_threads)
    try:
        yield
    finally:
        cpu.f32_gemm = saved_gemm
        XlaAttention.storage_dtype = saved_pools
        for k, v in saved_env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if blas:
            blas.scipy_openblas_set_num_threads(1)


def summary(runs, names, loads, a, final):
    """The record so far (written after every round: a long run stopped early keeps its rounds)."""
    meta = {"command": "python benchmarks/cpu_blas_ab.py " + " ".join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
            "git_commit": git_commit(pathlib.Path(__file__).parent), "jax_version": jax.__version__,
            "load_average": f"{os.getloadavg()[0]:.1f} at the end"}
    record = {"meta": meta, "machine": machine(), "model": a.model, "dtype": a.dtype, "rounds": len(runs[loads[0], names[-1]]), "results": []}
    for w in loads:
        ref = runs[w, names[0]][0]["output_ids_head"]
        for n in names:
            tps = [o["output_tokens"] / o["elapsed_s"] for o in runs[w, n]]
            heads = runs[w, n][0]["output_ids_head"]
            record["results"].append(dict(workload=w, variant=n, tok_s=statistics.median(tps), tok_s_min=min(tps),
                                          tok_s_max=max(tps), agree=sum(p == q for p, q in zip(heads, ref)) / len(ref)))
            if final:
                print(f"{w:8s} {n:6s} {statistics.median(tps):8.1f} tok/s [{min(tps):.1f}-{max(tps):.1f}]"
                      f"  heads agree with {names[0]}: {record['results'][-1]['agree']:.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--workloads", default="batch64,batch1,prefill")
    ap.add_argument("--variants", default="blas,xla")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--out")
    a = ap.parse_args()
    names, loads = a.variants.split(","), a.workloads.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(a.model, 0, tmp)
        requests = {w: make_workload("fixed", WORKLOADS[w][0], model.config.vocab_size, a.max_model_len, 0,
                                     input_len=(WORKLOADS[w][1],) * 2, output_len=(WORKLOADS[w][2],) * 2)
                    for w in loads}
        backends = {}
        for i, n in enumerate(names):
            config = dataclasses.replace(model.config,
                                         rope_original_max_position=model.config.rope_original_max_position + i)
            with variant(n):
                backends[n] = JaxserveBackend(BenchModel(model.name, config, model.params, model.tokenizer, tmp),
                                              BenchOptions(dtype=a.dtype, max_model_len=a.max_model_len))
                for w in loads:  # untimed, and the outputs' heads to compare
                    backends[n].run(requests[w])
            print(f"{n} ready (warm-up {backends[n].info['warmup_s']:.0f} s)", flush=True)
        runs = {(w, n): [] for w in loads for n in names}
        for r in range(a.rounds):
            for w in loads:
                for n in names[r % len(names):] + names[:r % len(names)]:
                    with variant(n):
                        out = backends[n].run(requests[w])
                    runs[w, n].append(out)
                    print(f"round {r} {w:8s} {n:6s} {out['output_tokens'] / out['elapsed_s']:8.1f} tok/s"
                          f"  compiles {out['compilations_after_warmup']}  load {os.getloadavg()[0]:.2f}", flush=True)
            summary(runs, names, loads, a, final=r == a.rounds - 1)


if __name__ == "__main__":
    main()
