"""Side by side: jaxserve and its peers on the same weights and workloads, rounds alternating the backends.

    nice -n 19 python benchmarks/peers/compare.py --model random:small-llama \\
        --backends jaxserve,hf,vllm,llama.cpp --workloads batch1,batch64,sharegpt --rounds 3 \\
        --out results/peer_throughput/small_llama/results.json

One process loads the model once (float32), builds every backend (``jaxserve.bench.backends``: jaxserve and
HF in this process, vLLM and llama.cpp as driver subprocesses in their own venvs, on exports of the same
params), serves each workload once untimed per backend, then runs ``--rounds`` rounds: in round r the
backend order is rotated by r, and each backend serves each workload once (``--back-to-back``: each backend
serves a workload ``--rounds`` times in a row instead, the spread of one process's repeated runs). The record
per (workload, backend): output tokens/s median and range over rounds, and the fraction of requests whose first 8 greedy
tokens match the first backend's (same weights, same argmax: near 1 unless a near-tie flips; a backend on
different weights would score ~0). Backends whose venv is missing are skipped, and said so.
Workloads: ``batch1`` (1 request, 64 -> 128 tokens), ``batch64`` (64 such requests), ``sharegpt``
(64 ShareGPT-like long-tailed requests, lengths scaled by ``--sharegpt-scale``), ``prefill64`` (batch64's prompts
with 1 output token each: its prefill alone, the tok/s column then counting 64 tokens a run).

A backend may name a variant after ``@``: ``llama.cpp@Q4_0`` stores the llama.cpp export's matrices as that GGML
type (``F16``, ``BF16``, ``Q8_0``, ``Q4_0``, ...; default from ``--dtype``), ``llama.cpp@file`` serves
``--gguf-file``; ``jaxserve@engine.quantization=nvfp4`` passes engine overrides (``+`` between several). Each variant
is a backend of its own in the rounds and the table, e.g. the 4-bit row::

    python benchmarks/peers/compare.py --model smollm2-135m-instruct --dtype bfloat16 --workloads batch1 \
        --backends jaxserve,jaxserve@engine.quantization=nvfp4,llama.cpp@F16,llama.cpp@Q4_0
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile

from jaxserve.bench.backends import BenchOptions, make_backend
from jaxserve.bench.peers import PEERS, missing
from jaxserve.bench.throughput import git_commit, load_model, machine, timed_runs
from jaxserve.bench.workload import make_workload

REPO = pathlib.Path(__file__).resolve().parents[2]
# environment variables that change what a backend runs, written into the recorded command when set
RECORDED_ENV = ("JAXSERVE_LLAMACPP_EXTRA_BUFTS", "JAXSERVE_CPU_KERNELS", "JAXSERVE_CPU_ATTENTION", "JAXSERVE_CPU_BLAS",
                "JAXSERVE_CPU_KERNEL_THREADS")


def workloads(names: list[str], vocab: int, max_model_len: int, scale: float, seed: int) -> dict:
    # name -> (dataset, requests, output tokens of a fixed request)
    presets = {"batch1": ("fixed", 1, 128), "batch64": ("fixed", 64, 128), "sharegpt": ("sharegpt", 64, 128),
               "prefill64": ("fixed", 64, 1)}
    unknown = sorted(set(names) - set(presets))
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {sorted(presets)}")
    return {n: make_workload(presets[n][0], presets[n][1], vocab, max_model_len, seed, input_len=(64, 64),
                             output_len=(presets[n][2],) * 2, length_scale=scale) for n in names}


def schedule(names: list[str], workloads: list[str], rounds: int, back_to_back: bool) -> list[tuple[int, str, str]]:
    """The timed runs in order, as (round, workload, backend): rounds rotating the backends (round r starts at the
    r-th), so that a slow minute of the VM is shared; or ``back_to_back``, each backend's rounds of a workload in a
    row."""
    if back_to_back:
        return [(r, w, n) for w in workloads for n in names for r in range(rounds)]
    return [(r, w, n) for r in range(rounds) for w in workloads for n in names[r % len(names):] + names[:r % len(names)]]


def backend_options(spec: str, args) -> tuple[str, BenchOptions]:
    """``NAME[@VARIANT]`` -> (the backend's name, its options); errors name the spec."""
    name, _, variant = spec.partition("@")
    opts = BenchOptions(dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        threads=args.threads, kv_cache_gib=args.kv_cache_gib,
                        gguf_file=args.gguf_file if name == "llama.cpp" else None)
    if not variant:
        return name, opts
    if name == "llama.cpp":
        if variant == "file":
            if not args.gguf_file:
                raise ValueError(f"backend {spec!r} serves --gguf-file, which was not given")
            return name, opts
        import gguf
        if variant not in gguf.GGMLQuantizationType.__members__:
            raise ValueError(f"backend {spec!r}: {variant!r} is not a GGML type (F16, BF16, Q8_0, Q4_0, ...)")
        return name, dataclasses.replace(opts, gguf_type=variant, gguf_file=None)
    if name == "jaxserve":
        from jaxserve.config import engine_kwargs
        overrides = tuple(variant.split("+"))
        engine_kwargs(list(overrides))  # raises, naming the key or value, before any model is built
        return name, dataclasses.replace(opts, overrides=overrides)
    raise ValueError(f"backend {spec!r}: only llama.cpp and jaxserve take a variant after '@'")


def agreement(heads: list[list[int]], reference: list[list[int]]) -> float:
    return sum(a == b for a, b in zip(heads, reference)) / len(reference)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:small-llama")
    p.add_argument("--backends", default="jaxserve,hf,vllm,llama.cpp")
    p.add_argument("--workloads", default="batch1,batch64,sharegpt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-gib", type=int, default=1,
                   help="the KV cache's memory for jaxserve (engine.kv_cache_bytes) and vLLM (VLLM_CPU_KVCACHE_SPACE)")
    p.add_argument("--sharegpt-scale", type=float, default=0.5)
    p.add_argument("--gguf-file", default=None, help="llama.cpp: this GGUF instead of an export of the params")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--back-to-back", action="store_true",
                   help="each backend's rounds of a workload in a row, not rotating the backends round by round: the "
                        "runs one process gives when nothing else runs between them (the spread of repeated runs)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    names = args.backends.split(",")
    options = {n: backend_options(n, args) for n in names}
    skipped = {n: missing(options[n][0]) for n in names if options[n][0] in PEERS and missing(options[n][0])}
    for n, why in skipped.items():
        print(f"skipping {n}: {why}", file=sys.stderr)
    names = [n for n in names if n not in skipped]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        model = load_model(args.model, args.seed, workdir)
        loads = workloads(args.workloads.split(","), model.config.vocab_size, args.max_model_len,
                          args.sharegpt_scale, args.seed)
        backends = {}
        try:
            for n in names:
                backends[n] = make_backend(options[n][0], model, options[n][1])
                print(f"{n} ready", file=sys.stderr, flush=True)
            runs: dict[tuple[str, str], list[dict]] = {}
            for w, requests in loads.items():  # the untimed warm-up, and the checks of every output
                for n, b in backends.items():
                    timed_runs(b, requests[:2], workdir, 1, tag=f"warm-{w}")
            for r, w, n in schedule(names, list(loads), args.rounds, args.back_to_back):
                runs.setdefault((w, n), []).extend(timed_runs(backends[n], loads[w], workdir, 1, tag=w))
                print(f"round {r} {w} {n}: {runs[(w, n)][-1]['elapsed_s']:.2f} s", file=sys.stderr, flush=True)
        finally:
            for b in backends.values():
                b.close()
    rows = []
    for w, requests in loads.items():
        tokens = sum(q.output_len for q in requests)
        reference = runs[(w, names[0])][-1]["output_ids_head"]
        for n in names:
            rates = [tokens / run["elapsed_s"] for run in runs[(w, n)]]
            rows.append({"model": args.model, "workload": w, "requests": len(requests), "output_tokens": tokens,
                         "backend": n, "tok_s_median": round(statistics.median(rates), 1),
                         "tok_s_min": round(min(rates), 1), "tok_s_max": round(max(rates), 1),
                         "seconds": [round(run["elapsed_s"], 4) for run in runs[(w, n)]],
                         f"agrees_with_{names[0]}": agreement(runs[(w, n)][-1]["output_ids_head"], reference)})
    result = {"meta": {"benchmark": "peer_throughput",
                       "command": "".join(f"{k}={os.environ[k]} " for k in RECORDED_ENV if k in os.environ)
                       + "python benchmarks/peers/compare.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "machine": machine(), "git_commit": git_commit(REPO),
                       "load_average": f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after",
                       "cpu_affinity": sorted(os.sched_getaffinity(0)), "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                       "skipped": skipped},
              "config": {"model": args.model, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs,
                         "max_model_len": args.max_model_len, "threads": args.threads,
                         "kv_cache_gib": args.kv_cache_gib,
                         "sharegpt_scale": args.sharegpt_scale, "rounds": args.rounds,
                         "back_to_back": args.back_to_back,
                         "backends": {n: b.info for n, b in backends.items()}},
              "tables": {"throughput": rows}}
    print("| workload | backend | output tok/s (median) | range | agrees |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['workload']} | {row['backend']} | {row['tok_s_median']} | {row['tok_s_min']}-{row['tok_s_max']} "
              f"| {row[f'agrees_with_{names[0]}']:.2f} |")
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
