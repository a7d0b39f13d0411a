"""The MoE feed-forward block: router + routed experts + optional shared experts.

Axis names: T tokens, H hidden size, I expert intermediate size, E experts, k experts per token.

Params of one block (``layers_i/mlp`` in the model tree):
``router`` [H, E], ``gate_proj``/``up_proj`` [E, H, I], ``down_proj`` [E, I, H], and when
``num_shared_experts > 0`` a ``shared_experts`` SwiGLU (width ``shared_intermediate_size``) that
every token passes through (DeepSeek / Qwen3 style), added to the routed output; with
``shared_expert_gate`` (Qwen2-MoE) it is scaled per token by sigmoid(x @ ``shared_gate`` [H, 1]).

The selection bias of loss-free balancing is read from the ``"router_state"`` collection
(see ``jaxserve/moe/balancing.py``); when the caller passes none, it is zero. The block accepts
any leading axes ([T, H] packed serving tokens or [B, L, H]) and returns ``(y, RouterStats)``;
the stats are also sown into ``"moe_stats"`` for training loops.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxserve.config import ModelConfig
from jaxserve.layers import SwiGLU
from jaxserve.moe.balancing import RouterStats, expert_load
from jaxserve.moe.experts import capacity_experts, ragged_experts
from jaxserve.moe.routers import route

_INIT = nn.initializers.normal(0.02)


def router_logits(weights: dict, x: jax.Array) -> jax.Array:
    """x [T, H] -> f32[T, E]; the router matmul runs in float32, as HF does for DeepSeek."""
    return x.astype(jnp.float32) @ weights["router"].astype(jnp.float32)


def routed_experts(weights: dict, config: ModelConfig, x: jax.Array,
                   bias: jax.Array | None = None) -> tuple[jax.Array, RouterStats]:
    """Single-device routed part of the block: x [T, H] -> (y [T, H], RouterStats)."""
    r = route(router_logits(weights, x), config, bias)
    w = (weights["gate_proj"], weights["up_proj"], weights["down_proj"])
    if config.moe_capacity_factor > 0:
        y, dropped = capacity_experts(x, r.experts, r.gates, *w, config.moe_capacity_factor)
    else:
        y, dropped = ragged_experts(x, r.experts, r.gates, *w), jnp.zeros((), jnp.int32)
    return y, RouterStats(expert_load(r.experts, config.num_experts), r.probs, r.experts, dropped)


def shared_experts(config: ModelConfig, name: str | None = None) -> SwiGLU:
    """The always-on experts as one SwiGLU module."""
    return SwiGLU(config.hidden_size, config.shared_intermediate_size, jnp.dtype(config.dtype), config.matmul_dtype,
                  name=name)


def shared_output(weights: dict, config: ModelConfig, x: jax.Array) -> jax.Array:
    """Shared experts of a block's params ``weights`` on x [T, H] -> [T, H] (gated when configured)."""
    y = shared_experts(config).apply({"params": weights["shared_experts"]}, x)
    if config.shared_expert_gate:
        y = y * jax.nn.sigmoid(x @ weights["shared_gate"])
    return y


class MoEBlock(nn.Module):
    config: ModelConfig
    # the routed part, ``routed_experts``'s signature: None for one device, else e.g. an expert-parallel
    # ``functools.partial(jaxserve.moe.parallel.expert_parallel_routed, mesh=..., axes=...)``
    routed: Callable | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, RouterStats]:
        c, dt = self.config, jnp.dtype(self.config.dtype)
        e, h, i = c.num_experts, c.hidden_size, c.expert_intermediate_size
        weights = {"router": self.param("router", _INIT, (h, e), dt),
                   "gate_proj": self.param("gate_proj", _INIT, (e, h, i), dt),
                   "up_proj": self.param("up_proj", _INIT, (e, h, i), dt),
                   "down_proj": self.param("down_proj", _INIT, (e, i, h), dt)}
        flat = x.reshape(-1, h)
        y, stats = (self.routed or routed_experts)(weights, c, flat, self._selection_bias(e))
        self.sow("moe_stats", "stats", stats)
        if c.num_shared_experts:
            shared = shared_experts(c, "shared_experts")(flat)
            if c.shared_expert_gate:
                shared = shared * jax.nn.sigmoid(flat @ self.param("shared_gate", _INIT, (h, 1), dt))
            y = y + shared
        return y.reshape(x.shape), stats

    def _selection_bias(self, num_experts: int) -> jax.Array | None:
        if not (self.is_initializing() or self.has_variable("router_state", "bias")):
            return None
        bias = self.variable("router_state", "bias", jnp.zeros, (num_experts,), jnp.float32)
        return jax.lax.stop_gradient(bias.value)
