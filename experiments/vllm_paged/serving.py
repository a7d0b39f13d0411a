"""Online serving on an ``LLMEngine``: timed arrivals, one engine step per clock tick (host).

The clock counts engine steps (an iteration of continuous batching); requests join the queue
at the first step at or after their arrival time, and a request's latency is the number of
steps from its arrival to the end of the step that produced its last token. When nothing is
running the clock jumps to the next arrival. Steps are the time unit because on a loaded CPU
wall time is noise; the wall seconds spent inside ``engine.step`` are recorded beside them.

After every step the driver samples the batch (requests that ran; ``mean_batch_saturated``
averages it over the steps that left requests waiting: the steady-state concurrency when
overloaded) and, every ``probe_every``
steps, the KV memory breakdown (``experiments.vllm_paged.kv_accounting``), flagged ``saturated`` when
requests were left waiting, and the blocks in use with and without sharing.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from experiments.vllm_paged.kv_accounting import block_sharing, kv_breakdown
from jaxserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class TimedRequest:
    arrival: float  # in steps
    prompt_token_ids: list[int]
    output_len: int
    n: int = 1


@dataclass
class ServingResult:
    arrival: list[float] = field(default_factory=list)  # per request, in input order
    finish: list[int] = field(default_factory=list)  # step count when its last token came
    output_len: list[int] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)  # per step: requests that ran
    saturated: list[bool] = field(default_factory=list)  # per step: requests were left waiting
    breakdowns: list[tuple[bool, dict]] = field(default_factory=list)  # (saturated, fractions)
    blocks: list[tuple[int, int]] = field(default_factory=list)  # (physical, unshared) blocks per probe
    steps: int = 0
    wall_s: float = 0.0
    preemptions: int = 0

    def summary(self) -> dict:
        lat = np.asarray(self.finish, float) - np.asarray(self.arrival)
        span = max(self.finish) - min(self.arrival)
        sat = [b for b, s in zip(self.batch, self.saturated) if s]
        return {"requests": len(lat), "steps": self.steps, "wall_s": self.wall_s,
                "throughput_req_per_step": len(lat) / span,
                "throughput_req_per_s": len(lat) / self.wall_s if self.wall_s else math.nan,
                "mean_latency_steps": float(lat.mean()),
                "normalized_latency": float(np.mean(lat / np.asarray(self.output_len))),
                "mean_batch": float(np.mean(self.batch)), "max_batch": int(max(self.batch)),
                "mean_batch_saturated": float(np.mean(sat)) if sat else math.nan,
                "preemptions": self.preemptions, "sharing_saving": sharing_saving(self.blocks),
                "kv": mean_breakdown(self.breakdowns), "kv_saturated": mean_breakdown(self.breakdowns, True)}


def sharing_saving(blocks: Sequence[tuple[int, int]]) -> float:
    """Fraction of block memory that sharing saved, over all probes: 1 - physical / unshared."""
    unshared = sum(u for _, u in blocks)
    return 1.0 - sum(p for p, _ in blocks) / unshared if unshared else 0.0


def mean_breakdown(samples: Sequence[tuple[bool, dict]], saturated_only: bool = False) -> dict:
    """Mean of the KV fractions over the samples (only the saturated ones if asked); {} if none."""
    rows = [f for sat, f in samples if sat or not saturated_only]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}


def serve(engine, requests: Sequence[TimedRequest], *, probe_every: int = 1,
          max_steps: int | None = None) -> ServingResult:
    """Runs ``requests`` (sorted by arrival) on an idle ``engine`` with ``ignore_eos``, greedy."""
    if engine.has_unfinished():
        raise ValueError("serve needs an idle engine")
    if any(b.arrival < a.arrival for a, b in zip(requests, requests[1:])):
        raise ValueError("requests must be sorted by arrival time")
    res = ServingResult(arrival=[r.arrival for r in requests], finish=[-1] * len(requests),
                        output_len=[r.output_len for r in requests])
    sched, nxt, clock = engine.scheduler, 0, 0
    before = sched.num_preemptions
    while nxt < len(requests) or engine.has_unfinished():
        if not engine.has_unfinished():
            clock = max(clock, math.ceil(requests[nxt].arrival))
        while nxt < len(requests) and requests[nxt].arrival <= clock:
            r = requests[nxt]
            engine.add_request(r.prompt_token_ids, SamplingParams(max_tokens=r.output_len, n=r.n, temperature=0,
                                                                  ignore_eos=True), request_id=str(nxt))
            nxt += 1
        t0 = time.perf_counter()
        produced = engine.step()
        res.wall_s += time.perf_counter() - t0
        clock += 1
        res.steps += 1
        ran = {t.request_id for t in produced} | {s.request_id for s in sched.running}
        res.batch.append(len(ran))
        res.saturated.append(bool(sched.waiting))
        for t in produced:
            if t.finished and res.finish[int(t.request_id)] < 0:
                res.finish[int(t.request_id)] = clock
                engine.finished.pop(t.request_id, None)
        if res.steps % probe_every == 0:
            res.breakdowns.append((bool(sched.waiting), kv_breakdown(sched).fractions()))
            res.blocks.append(block_sharing(sched))
        if max_steps is not None and res.steps >= max_steps:
            raise RuntimeError(f"serving did not finish within max_steps={max_steps}")
    res.preemptions = sched.num_preemptions - before
    return res
