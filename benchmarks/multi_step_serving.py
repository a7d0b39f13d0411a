"""Multi-step decoding at a live server: what ``num_scheduler_steps`` costs in latency for what it gains in throughput.

    python benchmarks/multi_step_serving.py [--model smollm2-135m-instruct] [--dtype bfloat16] [--steps 1,8]
                                            [--rates 4,8] [--num-prompts 120] [--length-scale 0.5]
                                            [--out results/multi_step_serving/results.json]

For each K in ``--steps``, one ``jaxserve serve`` process (``engine.num_scheduler_steps=K``, 1 GiB of KV cache,
max_model_len 1024, 64 seats: compare.py's engine) warmed up at start; 16 requests sent at once, untimed (first-use
costs); then the same ShareGPT-like requests (``--num-prompts``, lengths x ``--length-scale``, greedy) at each Poisson
``--rates`` (requests/s), as ``jaxserve bench serve``. A row per (K, rate): vLLM's ``benchmark_serving`` figures
(ms) and the server's start-up time (its warm-up compiles each decode bucket's program K steps unrolled).
"""
import argparse
import math
import sys
import time

from jaxserve.bench.rate_sweep import served_model
from jaxserve.bench.serve import bench_rate
from jaxserve.bench.server_process import ServerProcess
from jaxserve.bench.throughput import write_results
from jaxserve.bench.workload import make_workload

FIGURES = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
           "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms", "mean_norm_latency_ms")
ENGINE = ["engine.max_model_len=1024", f"engine.kv_cache_bytes={2**30}", "engine.max_num_seqs=64"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--steps", default="1,8")
    ap.add_argument("--rates", default="4,8")
    ap.add_argument("--num-prompts", type=int, default=120)
    ap.add_argument("--length-scale", type=float, default=0.5)
    ap.add_argument("--out", default="results/multi_step_serving/results.json")
    a = ap.parse_args(argv)
    rows = []
    for k in map(int, a.steps.split(",")):
        start = time.perf_counter()
        with ServerProcess(a.model, [*ENGINE, f"engine.num_scheduler_steps={k}"], ["--dtype", a.dtype]) as url:
            ready_s = time.perf_counter() - start
            info = served_model(url)
            requests = make_workload("sharegpt", a.num_prompts, info["vocab_size"], info["max_model_len"], 0,
                                     length_scale=a.length_scale)
            bench_rate(url, requests[:16], math.inf, seed=1)  # untimed: first-use costs
            for rate in map(float, a.rates.split(",")):
                res = bench_rate(url, requests, rate)
                if res["failed"]:
                    raise RuntimeError(f"K={k}, rate {rate}: {res['failed']} requests failed: {res['errors'][:3]}")
                rows.append({"num_scheduler_steps": k, "rate": rate, "server_ready_s": round(ready_s, 1),
                             **{f: round(res[f], 2) for f in FIGURES}})
                print(rows[-1], flush=True)
    write_results(a.out, "benchmarks/multi_step_serving.py", argv, {"serving": rows})


if __name__ == "__main__":
    main()
