"""What an EAGLE draft would have read at the positions plain steps ran without it (host bookkeeping, no JAX).

A plain decode step of a speculative engine runs the target alone; an EAGLE draft's pass over the same token needs
the target's hidden state before it (the draft's feature f_{p-1} at position p), which the runner holds on the host
when the step runs (it is what the step gives the draft). Keeping those features lets the step skip the draft, as a
draft model's plain steps do, and the sequence's next round first run the draft over the positions it skipped from
the features kept (``step_programs.eagle_catch_up``): its pool then holds what the skipped passes would have written.

Memory: one feature (E values in the draft's dtype) per skipped position of a live sequence, dropped once the draft
has caught up; live positions are bounded by the KV pool, so at most its token count times E values (SmolLM2 in
bf16: 1.1 KB a position against the target's 23 KB of K/V).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class FeatureBacklog:
    """Features of contiguous positions [start, start + len(features)) of one sequence: features[i] is the draft's
    input feature at position start + i."""
    seq: object
    start: int
    features: list[np.ndarray] = dataclasses.field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.features)

    def record(self, position: int, feature: np.ndarray) -> None:
        """The feature at ``position``: appended, rewritten (a position run again after a preemption reads the same
        feature), or, past a gap, the start of a new run (the positions in the gap cannot be caught up)."""
        if self.start <= position < self.end:
            self.features[position - self.start] = feature
        elif position == self.end:
            self.features.append(feature)
        else:
            self.start, self.features = position, [feature]

    def span(self, lo: int, hi: int) -> list[np.ndarray] | None:
        """The features of positions [lo, hi), or None when some are not held."""
        if lo < self.start or hi > self.end:
            return None
        return self.features[lo - self.start: hi - self.start]

    def drop_before(self, position: int) -> None:
        """Forgets the positions before ``position`` (the draft holds them)."""
        if position >= self.end:
            self.start, self.features = position, []
        elif position > self.start:
            self.features = self.features[position - self.start:]
            self.start = position
