"""The EAGLE draft's feature backlog (``jaxserve.engine.draft_backlog``): contiguous runs, rewrites, gaps, spans."""
import numpy as np

from jaxserve.engine.draft_backlog import FeatureBacklog


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
