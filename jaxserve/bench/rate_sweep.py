"""Sustained request rate at a latency target, against a live server (host, no JAX): the vLLM paper's
Figure 12 reading (Kwon et al., SOSP 2023), in wall-clock time.

``sweep`` runs ``jaxserve bench serve`` (``bench_rate``) at each request rate, lowest first, on the same
requests, and stops once a rate's normalized latency (end-to-end latency / output tokens, per request) is
past ``give_up`` times the target: beyond the knee the queue only grows. ``sustained_rate`` reads the
highest rate whose latency statistic (``mean`` or ``p99``) stays under the target, every lower rate too.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

from jaxserve.bench.serve import bench_rate
from jaxserve.bench.workload import BenchRequest

STATS = ("mean", "p99")  # the normalized-latency statistics a sustained rate is read on


def served_model(base_url: str) -> dict:
    """The first model of the server's ``/v1/models`` (jaxserve's carries ``vocab_size`` and ``max_model_len``)."""
    import httpx
    r = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]


def sweep(base_url: str, requests: list[BenchRequest], rates: Sequence[float], *, stop_factor: float | None = None,
          warm: int = 0, seed: int = 0, progress=None) -> list[dict]:
    """One row per rate run: the rate, the bench summary's figures (ms) and the load average after it;
    ``progress(row)`` is called after each. ``warm``: first send that many of the requests at once, untimed
    (first-use costs of the server and the client stay out of the lowest rate's figures)."""
    if warm:
        bench_rate(base_url, requests[:warm], math.inf, seed=seed)
    rows = []
    for rate in sorted(rates):
        res = bench_rate(base_url, requests, rate, seed=seed)
        rows.append({"rate": rate, **{k: v for k, v in res.items() if isinstance(v, (int, float))},
                     "errors": res["errors"], "load_1m": os.getloadavg()[0]})
        if progress is not None:
            progress(rows[-1])
        first = rows[0]["mean_norm_latency_ms"]
        if stop_factor is not None and not res["mean_norm_latency_ms"] <= stop_factor * first:
            break
    return rows


def sustained_rate(rates: Sequence[float], latencies: Sequence[float], limit: float) -> tuple[float, str]:
    """Rate where the normalized latency crosses ``limit`` (linearly interpolated on the grid).

    Returns (rate, bound): bound "=" when interpolated, ">=" when the latency never crosses on the
    grid (the top rate is a lower bound), "<" when it is above the limit already at the lowest rate.
    """
    if not latencies[0] <= limit:
        return rates[0], "<"
    for i in range(1, len(rates)):
        if not latencies[i] <= limit:
            f = (limit - latencies[i - 1]) / (latencies[i] - latencies[i - 1])
            return rates[i - 1] + f * (rates[i] - rates[i - 1]), "="
    return rates[-1], ">="
