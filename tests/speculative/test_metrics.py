"""Metric definitions on hand-built counters (no model): vLLM's rate, Leviathan's α, lengths, calls."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.speculative.metrics import SpecMetrics, expected_acceptance_length, summarize


def test_record_round_and_summary():
    m = SpecMetrics.zeros(3, 4)
    # round 1: row 0 accepts 4 (all), row 1 accepts 1, row 2 is inactive
    m = m.record_round(jnp.array([True, True, False]), jnp.array([4, 1, 3]), jnp.array([5, 2, 4]))
    # round 2: row 0 accepts 0, row 1 accepts 2 but keeps 1 token (stopped mid-round)
    m = m.record_round(jnp.array([True, True, False]), jnp.array([0, 2, 0]), jnp.array([1, 1, 0]))
    np.testing.assert_array_equal(m.accepted_at, [[1, 1, 1, 1], [2, 1, 0, 0], [0, 0, 0, 0]])
    s = summarize(m, rows=2)
    assert s["rounds"] == 4 and s["drafted"] == 16 and s["accepted"] == 7 and s["generated"] == 9
    assert s["acceptance_rate"] == 7 / 16
    assert s["mean_acceptance_length"] == 1 + 7 / 4
    assert s["per_position_acceptance"] == [3 / 4, 2 / 4, 1 / 4, 1 / 4]
    # reached: position 0 in 4 rounds, 1 in 3, 2 in 2, 3 in 1 -> 10 draft tokens judged
    assert s["token_acceptance_prob"] == 7 / 10
    assert s["target_calls_per_token"] == 4 / 9  # no prefill counted in a hand-built counter


@pytest.mark.parametrize("alpha, gamma", [(0.0, 3), (0.5, 1), (0.6, 4), (0.9, 8), (1.0, 5)])
def test_expected_acceptance_length_is_the_truncated_geometric_mean(alpha, gamma):
    # tokens per round = 1 + sum_{i=1..γ} α^i
    assert expected_acceptance_length(alpha, gamma) == pytest.approx(sum(alpha ** i for i in range(gamma + 1)))


def test_rounds_that_draft_fewer_than_gamma_count_what_they_drafted():
    """Suffix decoding proposes 0..γ per round: drafted and α's denominator follow the real lengths."""
    m = SpecMetrics.zeros(2, 4)
    # row 0 drafts 2 and accepts both (reached 2, not 3); row 1 drafts nothing (a plain decode: reached 0)
    m = m.record_round(jnp.array([True, True]), jnp.array([2, 0]), jnp.array([3, 1]), jnp.array([2, 0]))
    # row 0 drafts 3 and accepts 1 (reached 2); row 1 drafts 1, rejected (reached 1)
    m = m.record_round(jnp.array([True, True]), jnp.array([1, 0]), jnp.array([2, 1]), jnp.array([3, 1]))
    s = summarize(m)
    assert s["drafted"] == 6 and s["accepted"] == 3 and s["rounds"] == 4
    assert s["acceptance_rate"] == 3 / 6 and s["token_acceptance_prob"] == 3 / 5
    assert s["mean_acceptance_length"] == 1 + 3 / 4
    full = SpecMetrics.zeros(1, 4).record_round(jnp.array([True]), jnp.array([2]), jnp.array([3]))
    assert summarize(full)["drafted"] == 4 and int(full.reached[0]) == 3  # None: γ drafted
