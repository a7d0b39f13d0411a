"""Routers against independent NumPy implementations of each family's formulas."""
import numpy as np
import pytest

from jaxserve.moe.routers import route
from tests.moe.conftest import moe_config


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def deepseek_reference(logits, bias, k, n_group, topk_group, scale, norm):
    """Token by token, with sorts instead of top_k: the DeepSeek-V3 formulas as written."""
    scores = 1 / (1 + np.exp(-logits))
    experts, gates = [], []
    for s in scores:
        biased = s + bias
        groups = biased.reshape(n_group, -1)
        group_score = np.sort(groups, axis=1)[:, -2:].sum(1)
        allowed = np.argsort(-group_score, kind="stable")[:topk_group]
        masked = np.where(np.isin(np.arange(len(s)) // groups.shape[1], allowed), biased, -np.inf)
        chosen = np.argsort(-masked, kind="stable")[:k]
        g = s[chosen] / (s[chosen].sum() if norm else 1.0)
        experts.append(chosen)
        gates.append(g * scale)
    return np.array(experts), np.array(gates)


def as_dense(experts, gates, e):
    """[T, k] choices -> [T, E] weights, so comparisons ignore the order of the k."""
    out = np.zeros((experts.shape[0], e))
    np.put_along_axis(out, experts, gates, axis=1)
    return out


@pytest.mark.parametrize("n_group,topk_group,norm", [(1, 1, True), (4, 2, True), (4, 1, False), (8, 3, True)])
def test_deepseek_router_matches_formula(n_group, topk_group, norm):
    config = moe_config(num_experts=16, num_experts_per_tok=4, router="deepseek_v3", n_group=n_group,
                        topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=2.5)
    rng = np.random.default_rng(n_group * 10 + topk_group)
    logits = rng.normal(size=(40, 16)).astype(np.float32)
    bias = rng.normal(scale=0.3, size=16).astype(np.float32)
    r = route(logits, config, bias)
    ref_e, ref_g = deepseek_reference(logits, bias, 4, n_group, topk_group, 2.5, norm)
    np.testing.assert_allclose(as_dense(np.asarray(r.experts), np.asarray(r.gates), 16),
                               as_dense(ref_e, ref_g, 16), atol=1e-6)
    scores = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(r.probs, scores / scores.sum(-1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize("router,norm", [("mixtral", True), ("qwen3_moe", False), ("qwen3_moe", True)])
def test_softmax_routers_match_formula(router, norm):
    config = moe_config(router=router, norm_topk_prob=norm, num_experts_per_tok=3)
    logits = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    r = route(logits, config)
    probs = softmax(logits)
    chosen = np.argsort(-probs, axis=1)[:, :3]
    gates = np.take_along_axis(probs, chosen, 1)
    if norm:  # mixtral: softmax over the top-k logits is softmax-then-renormalise
        gates = gates / gates.sum(1, keepdims=True)
    np.testing.assert_allclose(as_dense(np.asarray(r.experts), np.asarray(r.gates), 8),
                               as_dense(chosen, gates, 8), atol=1e-6)


@pytest.mark.parametrize("router", ["mixtral", "qwen3_moe", "deepseek_v3"])
def test_bias_changes_selection_never_gate_values(router):
    config = moe_config(router=router)
    logits = np.random.default_rng(1).normal(size=(50, 8)).astype(np.float32)
    bias = np.zeros(8, np.float32)
    bias[5] = 10.0  # forces expert 5 into every token's choice
    plain, biased = route(logits, config), route(logits, config, bias)
    assert np.all(np.any(np.asarray(biased.experts) == 5, axis=1))
    assert not np.all(np.any(np.asarray(plain.experts) == 5, axis=1))
    np.testing.assert_array_equal(plain.probs, biased.probs)
    # gates are the unbiased formula applied to whichever experts were chosen
    affinity = {"mixtral": np.exp(logits), "qwen3_moe": softmax(logits), "deepseek_v3": 1 / (1 + np.exp(-logits))}
    raw = np.take_along_axis(affinity[router], np.asarray(biased.experts), 1)
    np.testing.assert_allclose(biased.gates, raw / raw.sum(1, keepdims=True), atol=1e-6)
