"""Expert computation: a bank of E SwiGLU experts applied to routed tokens.

Axis names: T tokens, H hidden size, I expert intermediate size, E experts, k experts per token,
A = T * k (token, expert) assignments, C capacity (assignments per expert).

Expert weights are stacked: ``gate_proj``/``up_proj`` [E, H, I], ``down_proj`` [E, I, H].

- ``ragged_experts``: dropless. Assignments are sorted by expert and each contiguous group goes
  through its expert with ``jax.lax.ragged_dot`` (a grouped matmul), then scattered back.
- ``capacity_experts``: Switch/GShard style. Each expert takes at most
  C = ceil(capacity_factor * A / E) assignments in token order; the rest are dropped (their
  output is zero) and counted. Dense [E, C, H] buffers, one batched matmul per projection.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def grouped_swiglu(x: jax.Array, group_sizes: jax.Array, w_gate: jax.Array, w_up: jax.Array,
                   w_down: jax.Array) -> jax.Array:
    """x [M, H] sorted by expert, group_sizes i32[E] (sum <= M; later rows give 0) -> [M, H]."""
    g = jax.lax.ragged_dot(x, w_gate, group_sizes)
    u = jax.lax.ragged_dot(x, w_up, group_sizes)
    return jax.lax.ragged_dot(jax.nn.silu(g) * u, w_down, group_sizes)


def ragged_experts(x: jax.Array, experts: jax.Array, gates: jax.Array, w_gate: jax.Array,
                   w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """Dropless MoE: x [T, H], experts i32[T, k], gates f32[T, k] -> sum_k gate * expert(x) [T, H]."""
    t, k = experts.shape
    num_experts = w_gate.shape[0]
    flat = experts.reshape(-1)  # [A]
    order = jnp.argsort(flat, stable=True)
    token = order // k
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    y = grouped_swiglu(x[token], group_sizes, w_gate, w_up, w_down)  # [A, H], sorted by expert
    y = y * gates.reshape(-1)[order, None].astype(y.dtype)
    return jnp.zeros_like(x).at[token].add(y)


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Assignments each expert accepts: ceil(capacity_factor * T * k / E), at least 1."""
    return max(1, math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def capacity_experts(x: jax.Array, experts: jax.Array, gates: jax.Array, w_gate: jax.Array,
                     w_up: jax.Array, w_down: jax.Array, capacity_factor: float
                     ) -> tuple[jax.Array, jax.Array]:
    """Capacity-limited MoE -> (y [T, H], dropped i32[]: assignments over capacity, output zero)."""
    t, k = experts.shape
    num_experts = w_gate.shape[0]
    cap = expert_capacity(t, k, num_experts, capacity_factor)
    flat = experts.reshape(-1)  # [A] in token order: earlier tokens win a slot
    onehot = jax.nn.one_hot(flat, num_experts, dtype=jnp.int32)  # [A, E]
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)  # position within its expert
    kept = slot < cap
    token = jnp.arange(t * k) // k
    dispatch = jnp.zeros((num_experts, cap, x.shape[-1]), x.dtype)
    dispatch = dispatch.at[flat, jnp.where(kept, slot, cap)].set(x[token], mode="drop")
    h = jax.nn.silu(jnp.einsum("ech,ehi->eci", dispatch, w_gate)) * jnp.einsum("ech,ehi->eci", dispatch, w_up)
    out = jnp.einsum("eci,eih->ech", h, w_down)  # [E, C, H]
    y = out[flat, jnp.minimum(slot, cap - 1)] * (gates.reshape(-1) * kept)[:, None].astype(x.dtype)
    return jnp.zeros_like(x).at[token].add(y), jnp.sum(~kept).astype(jnp.int32)
