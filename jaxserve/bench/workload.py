"""Synthetic request workloads for throughput and serving benchmarks (host, numpy only).

Length distributions (the vLLM paper's two datasets, Kwon et al. 2023, Fig. 11, are long-tailed):
``sharegpt`` and ``alpaca`` draw input and output lengths independently from log-normals with the
datasets' means (ShareGPT: input 161, output 338 tokens; Alpaca: input 19, output 58) and shape
sigma (1.0 for ShareGPT, 0.8 for Alpaca's shorter, less spread lengths), floored at 4 tokens,
inputs clipped to ``max_model_len // 2`` and outputs to what is left. ``length_scale`` multiplies
the means (scaled-down runs keep the shape of the distribution). ``fixed``: every request
``input_len[0]`` prompt tokens and ``output_len[0]`` output tokens.

A workload file (``save_workload`` / ``load_workload``) is the one form every benchmark backend reads,
the peers' driver scripts included (they parse it with ``json`` alone, never importing jaxserve)::

    {"format": "jaxserve-workload/1", "name": "sharegpt", "vocab_size": 4096,
     "requests": [{"prompt_token_ids": [17, 4011, ...], "output_len": 128}, ...]}
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import numpy as np

WORKLOAD_FORMAT = "jaxserve-workload/1"

# name -> (mean input, mean output, sigma) of the log-normal lengths
LOGNORMAL_DATASETS = {"sharegpt": (161.0, 338.0, 1.0), "alpaca": (19.0, 58.0, 0.8)}


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def make_workload(name: str, num_requests: int, vocab_size: int, max_model_len: int, seed: int = 0, *,
                  input_len: tuple[int, int] = (32, 96), output_len: tuple[int, int] = (64, 192),
                  length_scale: float = 1.0) -> list[BenchRequest]:
    """``random``: lengths uniform in the given [lo, hi] ranges. ``sharegpt`` / ``alpaca``: log-normal
    lengths with the dataset's means times ``length_scale`` and its long tail (module docstring).
    """
    rng = np.random.default_rng(seed)
    if name == "fixed":
        ins, outs = np.full(num_requests, input_len[0]), np.full(num_requests, output_len[0])
    elif name == "random":
        ins = rng.integers(input_len[0], input_len[1] + 1, num_requests)
        outs = rng.integers(output_len[0], output_len[1] + 1, num_requests)
    elif name in LOGNORMAL_DATASETS:
        mean_in, mean_out, sigma = LOGNORMAL_DATASETS[name]
        if length_scale <= 0:
            raise ValueError(f"length_scale must be > 0, got {length_scale}")

        def lengths(mean):  # lognormal mean = exp(mu + sigma^2 / 2)
            mu = np.log(mean * length_scale) - sigma**2 / 2
            return np.maximum(4, rng.lognormal(mu, sigma, num_requests)).astype(int)
        ins, outs = lengths(mean_in), lengths(mean_out)
    else:
        raise ValueError(f"unknown workload {name!r}; choose 'fixed', 'random', 'sharegpt' or 'alpaca'")
    ins = np.minimum(ins, max_model_len // 2)
    outs = np.minimum(outs, max_model_len - ins)
    return [BenchRequest(rng.integers(0, vocab_size, int(i)).tolist(), int(o)) for i, o in zip(ins, outs)]


def save_workload(path: str | pathlib.Path, requests: list[BenchRequest], *, name: str, vocab_size: int) -> None:
    """Writes ``requests`` as a workload file (module docstring)."""
    doc = {"format": WORKLOAD_FORMAT, "name": name, "vocab_size": vocab_size,
           "requests": [{"prompt_token_ids": list(r.prompt_token_ids), "output_len": r.output_len} for r in requests]}
    pathlib.Path(path).write_text(json.dumps(doc) + "\n")


def load_workload(path: str | pathlib.Path, vocab_size: int | None = None) -> tuple[str, list[BenchRequest]]:
    """(name, requests) of a workload file; every token id checked against ``vocab_size`` when given."""
    doc = json.loads(pathlib.Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("format") != WORKLOAD_FORMAT:
        raise ValueError(f"{path}: not a workload file (format must be {WORKLOAD_FORMAT!r}, "
                         f"got {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r})")
    requests = []
    for i, r in enumerate(doc["requests"]):
        ids, out = r["prompt_token_ids"], r["output_len"]
        if not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise ValueError(f"{path}: requests[{i}].prompt_token_ids must be a non-empty list of ints >= 0")
        if not isinstance(out, int) or out < 1:
            raise ValueError(f"{path}: requests[{i}].output_len must be an int >= 1, got {out!r}")
        if vocab_size is not None and max(ids) >= vocab_size:
            raise ValueError(f"{path}: requests[{i}] has token id {max(ids)} >= the model's vocab_size {vocab_size}")
        requests.append(BenchRequest(ids, out))
    return doc["name"], requests


def poisson_arrivals(rate: float, num_requests: int, seed: int = 0) -> np.ndarray:
    """Arrival times f64[N] of a Poisson process of ``rate`` requests per time unit, starting at 0."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num_requests)
    return np.cumsum(gaps) - gaps[0]


def gamma_arrivals(rate: float, num_requests: int, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Arrival times f64[N] (from 0) whose gaps are Gamma(shape=burstiness, mean=1/rate), as ``vllm bench
    serve`` draws them: burstiness 1 is a Poisson process, < 1 burstier, > 1 more even. ``rate=inf``: all at 0."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (inf: every request at once), got {rate}")
    if not (burstiness > 0 and np.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness}")
    if np.isinf(rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), num_requests)
    return np.cumsum(gaps) - gaps[0]
