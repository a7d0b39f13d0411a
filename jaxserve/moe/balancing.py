"""Load balancing: load statistics, the loss-free bias update, and auxiliary-loss baselines.

Axis names: B sequences, L sequence length, T tokens, E experts, k experts per token.

**Router state.** The per-expert selection bias of loss-free balancing is *state*, not a
parameter: it lives in its own pytree, the Flax collection ``"router_state"``, shaped like the
model (``{"layers_3": {"mlp": {"bias": f32[E]}}}``), passed into the forward pass next to
``params`` and updated outside the gradient by ``update_router_state`` after each training step.
The optimizer never sees it, nothing is hidden in modules or globals.

**Load statistics.** The MoE block sows a ``RouterStats`` per layer into the ``"moe_stats"``
collection (``apply(..., mutable=["moe_stats"])``); ``layer_loads`` pulls out the per-layer
loads. MaxVio = (max load - mean load) / mean load (Wang et al. 2024): per batch from one
step's load, globally from loads accumulated with ``accumulate_loads``.

A training step with loss-free balancing (and optionally an auxiliary loss as a baseline)::

    (logits, _), st = Transformer(config).apply({"params": p, "router_state": rs}, tokens, positions,
                                                mutable=["moe_stats"])
    loss = nll(logits) + aux_loss(st["moe_stats"], "switch", alpha=1e-3)   # baseline only
    ...optimizer step on params...
    rs = update_router_state(rs, layer_loads(st["moe_stats"]), rate=1e-3)  # outside the gradient
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxserve.config import ModelConfig


@struct.dataclass
class RouterStats:
    load: jax.Array  # f32[E]: tokens routed to each expert (top-k assignments) in this call
    probs: jax.Array  # f32[T, E]: normalised affinities, for the auxiliary losses
    experts: jax.Array  # i32[T, k]: chosen experts
    dropped: jax.Array  # i32[]: assignments dropped by a capacity limit (0 when dropless)


def expert_load(experts: jax.Array, num_experts: int) -> jax.Array:
    """experts i32[..., k] -> f32[E]: number of assignments per expert."""
    return jnp.bincount(experts.reshape(-1), length=num_experts).astype(jnp.float32)


def max_violation(load: jax.Array) -> jax.Array:
    """MaxVio = (max_i load_i - mean load) / mean load, f32[] (0 when perfectly balanced)."""
    mean = jnp.mean(load, axis=-1)
    return (jnp.max(load, axis=-1) - mean) / jnp.maximum(mean, 1e-9)


def update_bias(bias: jax.Array, load: jax.Array, rate: float = 1e-3) -> jax.Array:
    """Loss-free balancing step: b_i += rate * sign(mean load - load_i) (Wang et al. 2024)."""
    return bias + rate * jnp.sign(jnp.mean(load) - load).astype(bias.dtype)


def init_router_state(config: ModelConfig) -> dict:
    """Zero selection biases for every MoE layer of ``config`` (the ``"router_state"`` collection)."""
    return {f"layers_{i}": {"mlp": {"bias": jnp.zeros(config.num_experts, jnp.float32)}}
            for i in range(config.num_layers) if config.is_moe_layer(i)}


def layer_loads(moe_stats: dict) -> dict:
    """``"moe_stats"`` collection -> ``{layer name: f32[E] load}`` (sown tuples summed)."""
    return {name: sum(s.load for s in layer["mlp"]["stats"]) for name, layer in moe_stats.items()}


def update_router_state(router_state: dict, loads: dict, rate: float = 1e-3) -> dict:
    """Applies ``update_bias`` to every layer's bias with that layer's load (from ``layer_loads``)."""
    return {name: {"mlp": {"bias": update_bias(layer["mlp"]["bias"], loads[name], rate)}}
            for name, layer in router_state.items()}


def accumulate_loads(total: dict | None, loads: dict) -> dict:
    """Running per-layer load sums, for MaxVio_global over many batches."""
    return dict(loads) if total is None else {k: total[k] + loads[k] for k in total}


def switch_aux_loss(probs: jax.Array, experts: jax.Array, alpha: float = 1e-3) -> jax.Array:
    """Switch/GShard loss alpha * E * sum_i f_i * P_i over all tokens.

    probs f32[T, E], experts i32[T, k]; f_i = assignments to i / (T * k), P_i = mean prob of i.
    Equals alpha when routing is uniform.
    """
    e = probs.shape[-1]
    f = expert_load(experts, e) / experts.size
    return alpha * e * jnp.sum(jax.lax.stop_gradient(f) * jnp.mean(probs.reshape(-1, e), axis=0))


def sequence_aux_loss(probs: jax.Array, experts: jax.Array, alpha: float = 1e-4) -> jax.Array:
    """DeepSeek-V3 sequence-wise loss, averaged over sequences.

    probs f32[B, L, E] (affinities normalised over E), experts i32[B, L, k]. Per sequence:
    f_i = E / (k * L) * #{t: i chosen}, P_i = mean_t probs[t, i], loss = alpha * sum_i f_i * P_i.
    """
    b, length, e = probs.shape
    k = experts.shape[-1]
    counts = jax.vmap(lambda x: expert_load(x, e))(experts)  # [B, E]
    f = jax.lax.stop_gradient(counts * e / (k * length))
    return alpha * jnp.mean(jnp.sum(f * jnp.mean(probs, axis=1), axis=-1))


AUX_LOSSES = ("switch", "sequence")


def aux_loss(moe_stats: dict, kind: str, alpha: float, batch_size: int = 1) -> jax.Array:
    """Auxiliary balance loss summed over the MoE layers of a ``"moe_stats"`` collection.

    kind: "switch" (``switch_aux_loss`` over all tokens) or "sequence" (``sequence_aux_loss``; the
    stats' [T] tokens are read as [batch_size, T // batch_size] sequences).
    """
    if kind not in AUX_LOSSES:
        raise ValueError(f"aux loss kind must be one of {AUX_LOSSES}, got {kind!r}")
    total = jnp.zeros((), jnp.float32)
    for layer in moe_stats.values():
        for s in layer["mlp"]["stats"]:
            if kind == "switch":
                total += switch_aux_loss(s.probs, s.experts, alpha)
            else:
                e, k = s.probs.shape[-1], s.experts.shape[-1]
                total += sequence_aux_loss(s.probs.reshape(batch_size, -1, e), s.experts.reshape(batch_size, -1, k),
                                           alpha)
    return total
