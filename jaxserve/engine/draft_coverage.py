"""Which positions a draft's KV pool holds for each sequence, and what it must run over before a round (host
bookkeeping, no JAX).

A draft model's or EAGLE draft's pool is addressed by the target's block tables. A fill runs the draft over the
fill's tokens, a round leaves it holding the round's accepted positions; a plain decode step of an engine whose
policy switched speculation off runs the target alone, and the draft then lags. Before the sequence's next round
the runner runs the draft alone over the positions it skipped (``DraftCoverage.catch_up``: packed steps within the
token budget). A draft model needs only the tokens; an EAGLE draft also reads the target's hidden state before
each position (its feature f_{p-1}), which the runner holds on the host when the plain step runs (it is what the
step would have given the draft): ``FeatureBacklog`` keeps those features until the draft has run over them.

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


class DraftCoverage:
    """Per live sequence: the draft's pool holds its K/V at positions [0, n) (``held``), and, for an EAGLE draft, the
    features of the decode positions from n on that plain steps ran without it. ``eagle``: whether the draft reads
    features (and its rounds start at L, the last token's position, not L-1 as a draft model's)."""

    def __init__(self, eagle: bool):
        self.eagle = eagle
        self._held: dict[int, tuple[object, int]] = {}  # seq_id -> (its Sequence, n)
        self._backlog: dict[int, FeatureBacklog] = {}

    def held(self, seq_id: int, default: int) -> int:
        """n: the draft holds [0, n) of the sequence (``default`` for one never seen: its prefix-cached blocks, or a
        fork's blocks shared with its parent, hold the draft's K/V too)."""
        entry = self._held.get(seq_id)
        return default if entry is None else entry[1]

    def after_fill(self, entries, draft_pass: bool, features=None) -> None:
        """After a fill: each entry's target K/V at [start_pos, context) is new (after a preemption, on other
        blocks), so the draft holds at most [0, start_pos), and also the entry's tokens when the draft ran. An EAGLE
        decode the draft has not run over keeps its feature (``features[k]`` for entry k: what the fill gave it)."""
        for k, e in enumerate(entries):
            n = min(self.held(e.seq_id, e.start_pos), e.start_pos)
            n = e.context_len if draft_pass and n == e.start_pos else n
            self._held[e.seq_id] = (e.seq, n)
            if self.eagle and len(e.token_ids) == 1 and n <= e.start_pos:
                backlog = self._backlog.get(e.seq_id)
                if backlog is None:
                    backlog = self._backlog[e.seq_id] = FeatureBacklog(e.seq, e.start_pos)
                backlog.record(e.start_pos, features[k])

    def after_round(self, e, held: int) -> None:
        """After a round: the draft holds [0, held) of the entry's sequence."""
        self._held[e.seq_id] = (e.seq, held)

    def round_start(self, e) -> int:
        """The position the entry's round runs the draft from (it must hold everything before): L-1 for a draft
        model (``spec_round``), L for an EAGLE draft (``eagle_round``'s first step, from the carried feature)."""
        return e.start_pos if self.eagle else e.start_pos - 1

    def catch_up(self, entries, max_tokens: int, max_entries: int):
        """Before a round over ``entries``: the catch-up steps, each a list of (entry, start, n, features) pieces
        (features: n arrays for an EAGLE draft, else None), at most ``max_tokens`` tokens and ``max_entries`` pieces
        a step and one piece of a sequence per step (a piece attends to the ones before it); afterwards every entry
        counts as held up to its round's start. An EAGLE row missing a feature (a multi-token fill ran while its
        draft was behind: never in plain decoding) is not caught up: its draft reads stale K/V there, which lowers
        acceptance, never exactness."""
        todo = []
        for e in entries:
            upto = self.round_start(e)
            have = self.held(e.seq_id, upto)
            if have < upto and (not self.eagle or self._span(e.seq_id, have, upto) is not None):
                todo.append([e, have, upto])
        steps = []
        while todo:
            pieces, budget = [], max_tokens
            for item in todo[:max_entries]:
                (e, have, upto), n = item, min(item[2] - item[1], budget)
                if n == 0:
                    break
                pieces.append((e, have, n, self._span(e.seq_id, have, have + n) if self.eagle else None))
                item[1], budget = have + n, budget - n
            steps.append(pieces)
            todo = [item for item in todo if item[1] < item[2]]
        for e in entries:
            upto = self.round_start(e)
            self._held[e.seq_id] = (e.seq, max(upto, self.held(e.seq_id, upto)))
            if e.seq_id in self._backlog:
                self._backlog[e.seq_id].drop_before(upto)
        return steps

    def retire(self) -> None:
        """Forgets finished sequences."""
        self._held = {k: v for k, v in self._held.items() if not v[0].is_finished}
        self._backlog = {k: b for k, b in self._backlog.items() if not b.seq.is_finished}

    def _span(self, seq_id: int, lo: int, hi: int):
        backlog = self._backlog.get(seq_id)
        return None if backlog is None else backlog.span(lo, hi)
