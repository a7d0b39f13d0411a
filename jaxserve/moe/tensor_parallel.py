"""Tensor-parallel experts (vLLM's layout without expert parallelism): every device holds every expert,
each on a 1/T slice of its intermediate dimension.

Axis names: T tokens, H hidden size, I expert intermediate size, E experts, N size of the tensor axis.

gate/up banks [E, H, I] are split on I (column-parallel), the down bank [E, I, H] on I (row-parallel);
the router is replicated. Inside ``jax.shard_map`` each device routes the whole (replicated) batch, which is
small and identical everywhere, runs every chosen expert on its I/N slice, and one ``psum`` over the tensor
axis adds the partial down projections: one all-reduce of [T, H] per MoE layer, no expert weight moves.
SwiGLU is elementwise in I, so the result is the single-device block's up to the order of the final sum.
"""
from __future__ import annotations

import jax
from jax.sharding import Mesh, PartitionSpec as P

from jaxserve.config import ModelConfig
from jaxserve.moe.balancing import RouterStats
from jaxserve.moe.layer import routed_experts


def bank_specs(axis: str) -> dict[str, P]:
    """Each expert bank's split over ``axis``: gate/up on I (their last dim), down on I (its middle dim)."""
    return {"gate_proj": P(None, None, axis), "up_proj": P(None, None, axis), "down_proj": P(None, axis, None)}


def tensor_parallel_routed(weights: dict, config: ModelConfig, x: jax.Array, bias: jax.Array | None = None, *,
                           mesh: Mesh, axis: str) -> tuple[jax.Array, RouterStats]:
    """``routed_experts`` with the expert banks split on I over mesh ``axis``: x [T, H] -> (y [T, H], RouterStats),
    both replicated. ``weights``: ``MoEBlock``'s router [H, E] and banks; bias: f32[E] selection bias or None."""
    banks = bank_specs(axis)
    specs = {name: banks.get(name, P()) for name in weights}
    extra = () if bias is None else (bias,)

    def local(w, xs, *b):
        y, stats = routed_experts(w, config, xs, *b)
        return jax.lax.psum(y, axis), stats

    fn = jax.shard_map(local, mesh=mesh, in_specs=(specs, P(), *(P() for _ in extra)), out_specs=(P(), P()),
                       check_vma=False)
    return fn(weights, x, *extra)
