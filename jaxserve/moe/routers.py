"""Token-choice routers: router logits -> (chosen experts, gate weights, affinities).

Axis names: T tokens, E experts (``num_experts``), k experts chosen per token.

Every router takes an optional per-expert ``bias`` f32[E] for auxiliary-loss-free balancing
(Wang et al. 2024): it is added to the affinities only to *choose* the experts; the gate weights
always come from the unbiased affinities. With a zero bias each router is exactly its model family:

- ``mixtral``: softmax over the top-k logits (= softmax over all, top-k, renormalised).
- ``qwen3_moe``: softmax over all E, top-k, renormalised only when ``norm_topk_prob``.
- ``deepseek_v3``: sigmoid affinities; experts in ``n_group`` groups, a group scored by the sum of
  its two best biased affinities, the ``topk_group`` best groups kept; top-k over those on
  affinity + bias; gates = unbiased affinities of the chosen, normalised over them when
  ``norm_topk_prob``, times ``routed_scaling_factor``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxserve.config import ModelConfig


@struct.dataclass
class Routing:
    experts: jax.Array  # i32[T, k]: chosen experts
    gates: jax.Array  # f32[T, k]: weight of each chosen expert's output
    probs: jax.Array  # f32[T, E]: affinities normalised over E (softmax, or sigmoid / sum); aux losses use them


def route(logits: jax.Array, config: ModelConfig, bias: jax.Array | None = None) -> Routing:
    """logits f32[T, E] (router matmul, computed in float32), bias f32[E] or None -> Routing."""
    fn = {"mixtral": mixtral_router, "qwen3_moe": qwen3_moe_router, "deepseek_v3": deepseek_v3_router}
    if config.router not in fn:
        raise ValueError(f"unknown router {config.router!r}; known: {sorted(fn)}")
    logits = logits.astype(jnp.float32)
    bias = jnp.zeros(logits.shape[-1], jnp.float32) if bias is None else bias.astype(jnp.float32)
    return fn[config.router](logits, config, bias)


def mixtral_router(logits, config: ModelConfig, bias) -> Routing:
    probs = jax.nn.softmax(logits, axis=-1)
    _, experts = jax.lax.top_k(logits + bias, config.num_experts_per_tok)
    gates = jax.nn.softmax(jnp.take_along_axis(logits, experts, axis=-1), axis=-1)
    return Routing(experts, gates, probs)


def qwen3_moe_router(logits, config: ModelConfig, bias) -> Routing:
    probs = jax.nn.softmax(logits, axis=-1)
    _, experts = jax.lax.top_k(probs + bias, config.num_experts_per_tok)
    gates = jnp.take_along_axis(probs, experts, axis=-1)
    if config.norm_topk_prob:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return Routing(experts, gates, probs)


def deepseek_v3_router(logits, config: ModelConfig, bias) -> Routing:
    scores = jax.nn.sigmoid(logits)  # [T, E]
    choice = scores + bias
    choice = jnp.where(_group_mask(choice, config.n_group, config.topk_group), choice, -jnp.inf)
    _, experts = jax.lax.top_k(choice, config.num_experts_per_tok)
    gates = jnp.take_along_axis(scores, experts, axis=-1)
    if config.norm_topk_prob:
        gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-20)
    gates = gates * config.routed_scaling_factor
    return Routing(experts, gates, scores / jnp.sum(scores, axis=-1, keepdims=True))


def _group_mask(choice: jax.Array, n_group: int, topk_group: int) -> jax.Array:
    """bool[T, E]: experts in each token's ``topk_group`` best groups (all True when n_group == 1)."""
    if n_group == 1:
        return jnp.ones(choice.shape, bool)
    t, e = choice.shape
    grouped = choice.reshape(t, n_group, e // n_group)
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [T, G]
    _, best = jax.lax.top_k(group_scores, topk_group)
    keep = jnp.zeros((t, n_group), bool).at[jnp.arange(t)[:, None], best].set(True)
    return jnp.repeat(keep, e // n_group, axis=1)
