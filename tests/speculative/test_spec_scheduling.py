"""Scheduler bookkeeping for speculative decoding (host only): lookahead slots, multi-token updates, rollback."""
from dataclasses import dataclass

import pytest

from jaxserve.cache.block_manager import BlockManager
from jaxserve.engine.scheduler import Scheduler

GAMMA = 3


@dataclass(frozen=True)
class Params:
    max_tokens: int = 20
    stop_token_ids: tuple = ()
    n: int = 1


def scheduler(budget=64, blocks=16):
    return Scheduler(BlockManager(blocks, 4), max_num_seqs=4, max_num_batched_tokens=budget, max_model_len=64,
                     eos_token_id=0, num_lookahead_slots=GAMMA)


def prefilled(sched, prompt=(5, 6, 7, 8, 9), params=Params()):
    sched.add_request("r", list(prompt), params)
    out = sched.schedule()
    assert [e.num_lookahead for e in out.scheduled] == [0]  # a prefill never speculates
    sched.update(out, {out.scheduled[0].seq_id: 11})
    return sched.requests["r"].seqs[0]


def test_decode_gets_lookahead_slots_and_a_round_returns_the_unused_ones():
    sched = scheduler()
    seq = prefilled(sched)
    out = sched.schedule()
    (e,) = out.scheduled
    assert (e.num_lookahead, e.start_pos, e.token_ids) == (GAMMA, 5, [11])
    assert sched.bm.num_slots(seq.seq_id) == 5 + 1 + GAMMA and len(e.block_table) == 3  # positions 0..8
    assert out.num_batched_tokens == 1 + GAMMA
    sched.update(out, {seq.seq_id: [12, 13, 14]})  # two drafts accepted, then the target's token
    assert seq.output_token_ids == [11, 12, 13, 14]
    assert seq.num_computed_tokens == 8 == sched.bm.num_slots(seq.seq_id)  # K/V of 11, 12, 13 kept; 14 pending
    sched.bm.check_invariants()
    assert sched.bm.stats().num_cached == 2  # blocks [5..8] and [9, 11, 12, 13] are full and published


def test_round_stops_at_a_stop_token_or_max_tokens_mid_round():
    sched = scheduler()
    seq = prefilled(sched, params=Params(stop_token_ids=(13,)))
    out = sched.schedule()
    res = sched.update(out, {seq.seq_id: [12, 13, 14, 15]})
    assert seq.output_token_ids == [11, 12, 13] and seq.finish_reason == "stop"
    assert [r.request_id for r in res.finished] == ["r"] and sched.bm.num_used == 0

    sched = scheduler()
    seq = prefilled(sched, params=Params(max_tokens=3))
    out = sched.schedule()
    sched.update(out, {seq.seq_id: [12, 13, 14]})
    assert seq.output_token_ids == [11, 12, 13] and seq.finish_reason == "length"


@pytest.mark.parametrize("max_tokens, model_len", [(2, 64), (20, 7)], ids=["max_tokens", "max_model_len"])
def test_a_decode_with_one_token_left_gets_no_lookahead(max_tokens, model_len):
    """Its round would emit one token whatever it drafted: a plain decode costs less."""
    sched = Scheduler(BlockManager(16, 4), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=model_len,
                      eos_token_id=0, num_lookahead_slots=GAMMA)
    seq = prefilled(sched, params=Params(max_tokens=max_tokens))  # 5 prompt tokens + 11: one more may come
    out = sched.schedule()
    assert [e.num_lookahead for e in out.scheduled] == [0] and sched.bm.num_slots(seq.seq_id) == 6
    sched.update(out, {seq.seq_id: 12})
    assert seq.output_token_ids == [11, 12] and seq.is_finished


def test_no_lookahead_when_the_budget_is_short_and_bad_round_sizes_raise():
    sched = scheduler(budget=GAMMA)  # 1 + γ tokens do not fit
    seq = prefilled(sched, prompt=(5, 6))
    out = sched.schedule()
    assert out.scheduled[0].num_lookahead == 0 and sched.bm.num_slots(seq.seq_id) == 3
    with pytest.raises(ValueError, match="needs 1 sampled tokens, got 2"):
        sched.update(out, {seq.seq_id: [1, 2]})

    sched = scheduler()
    seq = prefilled(sched)
    out = sched.schedule()
    with pytest.raises(ValueError, match=f"needs 1 sampled tokens, got {GAMMA + 2}"):
        sched.update(out, {seq.seq_id: list(range(1, GAMMA + 3))})
    assert seq.output_token_ids == [11]  # nothing changed


def test_validation_counts_the_lookahead_slots():
    sched = scheduler(blocks=4)  # 16 slots: 10 + 5 - 1 fit, plus γ lookahead do not
    with pytest.raises(ValueError, match="need 5 KV blocks"):
        sched.add_request("r", list(range(1, 11)), Params(max_tokens=5))
