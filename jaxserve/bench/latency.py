"""``jaxserve bench latency``: the time to serve one fixed batch, in the style of ``vllm bench latency``.

``--batch-size`` requests (default 1: batch-1 decode) of ``--input-len`` random prompt tokens and
``--output-len`` greedy output tokens (EOS ignored), served ``--num-iters`` times by one backend after
``--num-iters-warmup`` untimed runs; the record is ``jaxserve bench throughput``'s schema with the
latencies, their percentiles and the decode time per output token added.
"""
from __future__ import annotations

import numpy as np

from jaxserve.bench.throughput import common_parser, emit, run_benchmark
from jaxserve.bench.workload import make_workload

PERCENTILES = (10, 25, 50, 75, 90, 99)


def _parser():
    p = common_parser("jaxserve bench latency")
    p.set_defaults(max_num_seqs=None)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--num-iters-warmup", type=int, default=1)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("batch_size", "input_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.num_iters_warmup < 0:
        raise ValueError(f"--num-iters-warmup must be >= 0, got {args.num_iters_warmup}")
    args.max_num_seqs = args.max_num_seqs or args.batch_size
    iters, args.num_iters = args.num_iters, args.num_iters + args.num_iters_warmup

    def build(config):
        return "fixed", make_workload("fixed", args.batch_size, config.vocab_size, args.max_model_len, args.seed,
                                      input_len=(args.input_len,) * 2, output_len=(args.output_len,) * 2)

    record = run_benchmark(args, argv, "latency", build)
    latencies = record["runs_elapsed_s"][-iters:]  # the warm-up iterations are not timed
    record.update(runs_elapsed_s=latencies, elapsed_s=float(np.median(latencies)), avg_latency_s=float(np.mean(latencies)),
                  percentiles_s={str(q): float(np.percentile(latencies, q)) for q in PERCENTILES},
                  ms_per_output_token=1e3 * float(np.median(latencies)) / args.output_len)
    record.update(requests_per_s=record["num_prompts"] / record["elapsed_s"],
                  output_tokens_per_s=record["output_tokens"] / record["elapsed_s"])
    emit(record, args.out)
    return 0
