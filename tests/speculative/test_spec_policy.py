"""The speculation policy (host, no JAX): when a step's decodes get lookahead slots, and the scheduler obeying it."""
from dataclasses import dataclass

import pytest

from jaxserve.cache.block_manager import BlockManager
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.spec_policy import SpeculationPolicy, batch_bucket
from jaxserve.speculative.config import SpeculativeConfig

GAMMA = 3


def test_batch_buckets_are_powers_of_two():
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 16, 17)] == [1, 2, 4, 4, 8, 16, 32]


def test_disable_by_batch_size_switches_off_at_the_threshold():
    p = SpeculationPolicy(GAMMA, disable_by_batch_size=4)
    assert [p.speculate(n) for n in (1, 3, 4, 16)] == [True, True, False, False]
    assert p.counts == {"speculative_steps": 2, "plain_steps": 2}
    assert SpeculationPolicy(GAMMA).speculate(64)  # no rule: always


def test_disable_by_batch_size_counts_running_sequences_not_only_decodes():
    p = SpeculationPolicy(GAMMA, disable_by_batch_size=16)
    # 16 requests whose prefills end unevenly: the first 3 decodes already run in a batch of 16
    assert [p.speculate(3, 16), p.speculate(3, 15), p.speculate(16, 16)] == [False, True, False]


def _timed(policy, speculated, b, seconds, per_row=None, times=3):
    for _ in range(times):
        policy.record(speculated, b, seconds, per_row)


def test_adaptive_times_each_arm_then_picks_the_faster_per_bucket():
    p = SpeculationPolicy(GAMMA, adaptive=True, probe_every=1000)
    assert p.speculate(16)  # nothing timed: try rounds first
    p.record(True, 16, 99.0, 2.0)  # the first sample of an arm may have compiled: dropped
    assert p.seconds(True, 16) is None and p.speculate(16)
    p.record(True, 16, 0.030, 2.0)
    assert p.seconds(True, 16) == pytest.approx(0.030) and not p.speculate(16)  # now time a plain step
    _timed(p, False, 16, 0.010)  # L = 2 tokens per row for 3x a plain step's time: plain wins
    assert p.tokens_per_round == pytest.approx(2.0) and not p.speculate(16)
    _timed(p, True, 1, 0.012, 2.0), _timed(p, False, 1, 0.010)  # batch 1: 2 tokens for 1.2x: rounds win
    assert p.speculate(1) and not p.speculate(16)


def test_adaptive_times_are_robust_to_a_compile_or_a_descheduled_step():
    p = SpeculationPolicy(GAMMA, adaptive=True, probe_every=1000, window=5)
    _timed(p, False, 16, 0.010), _timed(p, True, 16, 0.030, 4.0)
    p.record(False, 12, 25.0)  # 12 decodes share bucket 16 but compile their own program: an outlier
    assert p.seconds(False, 16) == pytest.approx(0.010) and p.speculate(16)  # 4 tokens for 3x: rounds
    _timed(p, False, 16, 0.005, times=3)  # plain steps got faster (say, the load went): the window follows
    assert p.seconds(False, 16) == pytest.approx(0.005) and not p.speculate(16)


def test_adaptive_rule_follows_the_measured_acceptance():
    p = SpeculationPolicy(GAMMA, adaptive=True, probe_every=1000, smoothing=1.0)  # no averaging: the last sample
    _timed(p, False, 4, 0.010)
    _timed(p, True, 4, 0.025, 3.0)
    assert p.speculate(4)  # 3 tokens for 2.5x a plain step
    p.record(True, 4, 0.025, 2.0)
    assert not p.speculate(4)  # acceptance fell: 2 tokens for 2.5x


def test_adaptive_probes_the_other_arm_every_probe_every_steps():
    p = SpeculationPolicy(GAMMA, adaptive=True, probe_every=4)
    _timed(p, False, 8, 0.010), _timed(p, True, 8, 0.050, 2.0)
    assert [p.speculate(8) for _ in range(8)] == [False, False, False, True] * 2


@dataclass(frozen=True)
class Params:
    max_tokens: int = 20
    stop_token_ids: tuple = ()
    n: int = 1


class Script:
    """A policy answering from a list, recording what it was asked."""

    def __init__(self, answers):
        self.answers, self.asked = list(answers), []

    def speculate(self, num_decodes, num_running):
        self.asked.append((num_decodes, num_running))
        return self.answers.pop(0)


def test_scheduler_withholds_lookahead_for_a_step_the_policy_runs_plain():
    policy = Script([True, False, True])
    sched = Scheduler(BlockManager(32, 4), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                      eos_token_id=0, num_lookahead_slots=GAMMA, speculation_policy=policy)
    for r in "ab":
        sched.add_request(r, [5, 6, 7], Params())
    out = sched.schedule()  # prefills: no decodes yet, nothing asked
    sched.update(out, {e.seq_id: 9 for e in out.scheduled})
    out = sched.schedule()
    assert [e.num_lookahead for e in out.scheduled] == [GAMMA, GAMMA]
    sched.update(out, {e.seq_id: [9, 9] for e in out.scheduled})
    out = sched.schedule()
    assert [e.num_lookahead for e in out.scheduled] == [0, 0] and out.num_batched_tokens == 2
    slots = [sched.bm.num_slots(e.seq_id) for e in out.scheduled]
    assert slots == [6, 6]  # 3 prompt + 2 round tokens + this step's one: no lookahead slots held
    sched.update(out, {e.seq_id: 9 for e in out.scheduled})
    assert policy.asked == [(2, 2), (2, 2)] and [e.num_lookahead for e in sched.schedule().scheduled] == [GAMMA, GAMMA]


def test_bad_policy_settings_raise():
    with pytest.raises(ValueError, match="disable_by_batch_size must be None or an int >= 1, got 0"):
        SpeculativeConfig(disable_by_batch_size=0)
    with pytest.raises(ValueError, match="adaptive must be a bool, got 'yes'"):
        SpeculativeConfig(adaptive="yes")
    assert SpeculativeConfig.from_json('{"method": "ngram", "adaptive": true}').adaptive


def test_scheduler_runs_a_decode_plain_while_the_batch_is_full_of_prefills():
    """disable_by_batch_size=2: a decode beside a sequence still prefilling (chunked) runs plain."""
    sched = Scheduler(BlockManager(32, 4), max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64,
                      eos_token_id=0, num_lookahead_slots=GAMMA,
                      speculation_policy=SpeculationPolicy(GAMMA, disable_by_batch_size=2))
    sched.add_request("short", [5, 6], Params())
    sched.add_request("long", list(range(1, 21)), Params())
    out = sched.schedule()  # short's prompt and the first chunk of long's
    sched.update(out, {e.seq_id: 9 for e in out.scheduled})
    out = sched.schedule()
    decodes = [e for e in out.scheduled if len(e.token_ids) == 1]
    assert len(decodes) == 1 and len(out.scheduled) == 2  # one decode, one prefill chunk
    assert decodes[0].num_lookahead == 0 and sched.policy.counts == {"speculative_steps": 0, "plain_steps": 1}
