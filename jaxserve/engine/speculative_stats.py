"""The speculative engine's acceptance counters, accumulated on the host from each step's
``RunnerOutput`` in numpy (the same fields and summary as ``speculative_generate``'s ``SpecMetrics``)."""
from __future__ import annotations

import numpy as np

from jaxserve.speculative.metrics import SpecMetrics, summarize

_KEEP = ("acceptance_rate", "token_acceptance_prob", "mean_acceptance_length", "per_position_acceptance",
         "target_calls_per_token", "rounds", "drafted", "accepted", "generated", "target_calls")


class SpeculativeStats:
    """One row of counters for the whole engine."""

    def __init__(self, method: str, gamma: int):
        self.method, self.gamma = method, gamma
        self.reset()

    def reset(self) -> None:
        z = np.zeros(1, np.int64)
        self.metrics = SpecMetrics(z, z, z, np.zeros((1, self.gamma), np.int64), z, z, z)

    def record_step(self, accepted: list[int], target_rows: int, generated: int,
                    drafted: list[int] | None = None) -> None:
        """A step's rounds (drafts accepted per round), target positions sampled or verified, tokens emitted;
        ``drafted``: tokens proposed per round (None: γ each)."""
        m, g, n = self.metrics, self.gamma, np.asarray(accepted, np.int64)
        hit = (np.arange(g)[None, :] < n[:, None]).sum(0)
        d = np.full(len(n), g, np.int64) if drafted is None else np.asarray(drafted, np.int64)
        self.metrics = m.replace(rounds=m.rounds + len(n), drafted=m.drafted + int(d.sum()),
                                 reached=m.reached + int(np.minimum(n + 1, d).sum()),
                                 accepted=m.accepted + int(n.sum()), accepted_at=m.accepted_at + hit,
                                 target_calls=m.target_calls + target_rows, generated=m.generated + generated)

    def as_dict(self) -> dict:
        s = summarize(self.metrics)
        return {"spec_method": self.method, "spec_gamma": self.gamma, **{f"spec_{k}": s[k] for k in _KEEP}}
