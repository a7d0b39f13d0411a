"""A stand-in for ``ModelRunner`` that does no device work: for studies of the schedule alone.

With ``ignore_eos`` the schedule (who runs, which blocks, when requests finish) does not depend
on which tokens are drawn, so a scheduling or memory study can replace the model by this runner
and run the real ``LLMEngine`` (scheduler, block manager, reservations) at paper-scale lengths on a
CPU. Tokens, log-probs and the top candidates (for beam search) come from a seeded numpy stream:
the top candidates are distinct ids with decreasing log-probs, as a model's would be.
"""
from __future__ import annotations

import numpy as np

from jaxserve.engine.batching import NUM_TOP_LOGPROBS as NUM_TOP
from jaxserve.engine.batching import RunnerOutput, collect_samples, sample_rows


class NullRunner:
    """``execute(out)`` returns a ``RunnerOutput`` as ``ModelRunner``'s, with the top candidates always
    filled in (beam search reads them); nothing is computed."""

    num_compilations = 0
    num_buckets = 0

    def __init__(self, vocab_size: int, seed: int = 0, avoid_token: int | None = None, on_execute=None):
        if vocab_size < NUM_TOP + 1:
            raise ValueError(f"vocab_size must be > {NUM_TOP}, got {vocab_size}")
        self.vocab_size = vocab_size
        self.avoid_token = avoid_token  # e.g. EOS, so beam search never completes a beam early
        self.rng = np.random.default_rng(seed)
        self.on_execute = on_execute  # called with each SchedulerOutput (a probe for drivers we don't own)
        self.steps = 0

    def warmup(self) -> int:
        return 0

    def execute(self, out, *, top_logprobs: bool = False, logprobs: bool = True) -> RunnerOutput:
        del top_logprobs, logprobs  # the fake top candidates and log-probs are always drawn
        self.steps += 1
        if self.on_execute is not None:
            self.on_execute(out)
        rows = sample_rows(out.scheduled)
        r = len(rows)
        # NUM_TOP consecutive ids from a random start, cyclic over the allowed ids: distinct, cheap to draw
        allowed = self.vocab_size - (self.avoid_token is not None)
        ids = (self.rng.integers(0, allowed, (r, 1)) + np.arange(NUM_TOP)) % allowed
        if self.avoid_token is not None:  # skip over the avoided id
            ids = np.where(ids >= self.avoid_token, ids + 1, ids)
        ids = ids.astype(np.int32)
        top_lps = (-np.cumsum(self.rng.exponential(1.0, (r, NUM_TOP)), axis=1)).astype(np.float32)
        result = collect_samples(out.scheduled, r, ids[:, 0], top_lps[:, 0])
        for k, row in enumerate(rows):
            result.top.setdefault(out.scheduled[row.entry].seq_id, (top_lps[k], ids[k]))
        return result
