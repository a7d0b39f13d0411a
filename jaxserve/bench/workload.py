"""Synthetic request workloads for throughput benchmarks (host, numpy only)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def make_workload(name: str, num_requests: int, vocab_size: int, max_model_len: int, seed: int = 0, *,
                  input_len: tuple[int, int] = (32, 96), output_len: tuple[int, int] = (64, 192)) -> list[BenchRequest]:
    """``random``: lengths uniform in the given [lo, hi] ranges. ``sharegpt``: log-normal lengths with
    ShareGPT's means (input 161, output 338 tokens) and its long tail, clipped to ``max_model_len``.
    """
    rng = np.random.default_rng(seed)
    if name == "random":
        ins = rng.integers(input_len[0], input_len[1] + 1, num_requests)
        outs = rng.integers(output_len[0], output_len[1] + 1, num_requests)
    elif name == "sharegpt":
        sigma = 1.0  # lognormal mean = exp(mu + sigma^2 / 2)
        ins = np.maximum(4, rng.lognormal(np.log(161) - sigma**2 / 2, sigma, num_requests)).astype(int)
        outs = np.maximum(4, rng.lognormal(np.log(338) - sigma**2 / 2, sigma, num_requests)).astype(int)
    else:
        raise ValueError(f"unknown workload {name!r}; choose 'random' or 'sharegpt'")
    ins = np.minimum(ins, max_model_len // 2)
    outs = np.minimum(outs, max_model_len - ins)
    return [BenchRequest(rng.integers(0, vocab_size, int(i)).tolist(), int(o)) for i, o in zip(ins, outs)]
