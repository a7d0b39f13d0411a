"""What a draft's pool holds and what a round must catch up (``jaxserve.engine.draft_coverage``): the EAGLE feature
backlog's runs, rewrites, gaps and spans; the catch-up plans of a draft model and an EAGLE draft after plain steps."""
import dataclasses

import numpy as np

from jaxserve.engine.draft_coverage import DraftCoverage, FeatureBacklog


def f(v):
    return np.full(2, float(v), np.float32)


def test_positions_append_rewrite_and_restart_past_a_gap():
    b = FeatureBacklog(seq=None, start=5)
    for p in (5, 6, 7):
        b.record(p, f(p))
    b.record(6, f(60))  # a position run again (after a preemption) is rewritten in place
    assert (b.start, b.end) == (5, 8) and [x[0] for x in b.span(5, 8)] == [5, 60, 7]
    assert b.span(4, 6) is None and b.span(6, 9) is None and b.span(6, 6) == []
    b.record(10, f(10))  # past a gap: 8 and 9 can never be caught up, so the run starts again
    assert (b.start, b.end) == (10, 11) and b.span(7, 11) is None and b.span(10, 11)[0][0] == 10


def test_dropping_what_the_draft_holds():
    b = FeatureBacklog(seq=None, start=0)
    for p in range(6):
        b.record(p, f(p))
    b.drop_before(2)
    assert (b.start, b.end) == (2, 6) and [x[0] for x in b.span(2, 6)] == [2, 3, 4, 5]
    b.drop_before(1)  # already dropped: nothing changes
    assert (b.start, b.end) == (2, 6)
    b.drop_before(9)  # past the end: empty, the next run starts there
    assert (b.start, b.end) == (9, 9) and b.span(9, 9) == []
    b.record(9, f(9))
    assert b.span(9, 10)[0][0] == 9


@dataclasses.dataclass
class Seq:
    is_finished: bool = False


@dataclasses.dataclass
class Entry:  # the fields of a ScheduledSequence the coverage reads
    seq_id: int
    start_pos: int
    token_ids: list
    seq: Seq

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


def decode(seq_id, pos, seqs):
    return Entry(seq_id, pos, [7], seqs[seq_id])


def test_a_draft_model_is_caught_up_over_the_plain_steps_it_skipped_in_budgeted_steps():
    seqs = {0: Seq(), 1: Seq()}
    cov = DraftCoverage(eagle=False)
    cov.after_fill([Entry(0, 0, [1] * 5, seqs[0]), Entry(1, 0, [1] * 3, seqs[1])], draft_pass=True)
    assert cov.held(0, -1) == 5 and cov.held(1, -1) == 3
    for step in range(4):  # plain decodes at positions 5.. and 3..: the draft skipped
        cov.after_fill([decode(0, 5 + step, seqs), decode(1, 3 + step, seqs)], draft_pass=False)
    assert cov.held(0, -1) == 5 and cov.held(1, -1) == 3
    # rounds at L = 9 and 7: the draft must hold [0, L - 1); budget 3 tokens, 2 pieces a step
    plan = cov.catch_up([decode(0, 9, seqs), decode(1, 7, seqs)], max_tokens=3, max_entries=2)
    assert [[(e.seq_id, start, n) for e, start, n, _ in step] for step in plan] == [[(0, 5, 3)], [(1, 3, 3)]]
    assert all(f is None for step in plan for *_, f in step)
    assert cov.held(0, -1) == 8 and cov.held(1, -1) == 6
    cov.after_round(decode(0, 9, seqs), 11)
    assert cov.held(0, -1) == 11 and cov.catch_up([decode(0, 12, seqs)], 3, 2) == []
    seqs[1].is_finished = True
    cov.retire()
    assert cov.held(1, -1) == -1 and cov.held(0, -1) == 11


def test_an_eagle_draft_is_caught_up_from_the_features_plain_steps_kept():
    seqs = {0: Seq()}
    cov = DraftCoverage(eagle=True)
    cov.after_fill([Entry(0, 0, [1] * 4, seqs[0])], draft_pass=True, features=[f(-1)])
    for pos in range(4, 9):  # plain decodes: each keeps the feature it gave the (skipped) draft
        cov.after_fill([decode(0, pos, seqs)], draft_pass=False, features=[f(pos)])
    plan = cov.catch_up([decode(0, 9, seqs)], max_tokens=3, max_entries=4)  # the round at 9 starts there
    assert [(start, n, [x[0] for x in feats]) for step in plan for _, start, n, feats in step] == [
        (4, 3, [4, 5, 6]), (7, 2, [7, 8])]
    assert cov.held(0, -1) == 9 and cov.catch_up([decode(0, 9, seqs)], 3, 4) == []


def test_an_eagle_row_missing_features_is_not_caught_up():
    seqs = {0: Seq()}
    cov = DraftCoverage(eagle=True)
    cov.after_fill([Entry(0, 0, [1] * 4, seqs[0])], draft_pass=True, features=[f(-1)])
    cov.after_fill([decode(0, 4, seqs)], draft_pass=False, features=[f(4)])
    cov.after_fill([Entry(0, 5, [1, 1], seqs[0])], draft_pass=True, features=[f(5)])  # a 2-token fill: its draft ran
    cov.after_fill([decode(0, 7, seqs)], draft_pass=False, features=[f(7)])
    assert cov.catch_up([decode(0, 8, seqs)], max_tokens=16, max_entries=4) == []
    assert cov.held(0, -1) == 8  # given up: stale K/V at 4..7 (acceptance only)
