"""Expert parallelism: the MoE block with its experts spread over a mesh axis.

Axis names: T tokens, H hidden, E experts, k experts per token, N = size of the expert axis,
E_l = E / N experts per device, T_l tokens per device, C per-destination capacity.

Tokens are split over the data and expert axes (each device owns T_l distinct tokens); expert
weights are split over the expert axis (device n holds experts [n E_l, (n+1) E_l)) and replicated
over the data axis; router and shared experts are replicated. Inside ``jax.shard_map`` each device:

1. routes its tokens (router and shared experts are local work);
2. packs its (token, expert) assignments per destination device into a send buffer
   [N, C, H] (padded: ``lax.all_to_all`` needs equal chunk sizes), with local expert ids;
3. **dispatch**: ``all_to_all`` over the expert axis: row n of what it receives came from device n;
4. runs its E_l experts on what it received with one grouped matmul (``ragged_dot``);
5. **combine**: ``all_to_all`` back, then weights each returned row by its gate and sums per token.

C defaults to the worst case T_l * min(k, E_l) (dropless: the result equals the single-device
block). A smaller C (``capacity_factor``) drops assignments past C per destination, in token order;
their output is zero and they are counted in ``EPStats.dropped``.

``dispatch="ragged"`` sends only the live rows with ``lax.ragged_all_to_all`` (GPU/TPU). XLA:CPU
does not implement it, so the CPU tests lower that path, and run it only with ragged_all_to_all emulated
(tests/parallel/ragged_a2a.py).
"""
from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxserve.config import ModelConfig
from jaxserve.moe.balancing import RouterStats, expert_load
from jaxserve.moe.experts import grouped_swiglu
from jaxserve.moe.layer import router_logits, shared_output
from jaxserve.moe.routers import route
from jaxserve.parallel.mesh import require_axis
from jaxserve.parallel.sharding import token_axes

DISPATCH = ("all_to_all", "ragged")


@struct.dataclass
class EPStats:
    load: jax.Array  # f32[E]: assignments per expert, whole batch
    dropped: jax.Array  # i32[]: assignments over the per-destination capacity, whole batch
    capacity: int = struct.field(pytree_node=False)  # C
    dispatched_bytes: int = struct.field(pytree_node=False)  # one all_to_all's send buffer, all devices


def ep_capacity(tokens_per_device: int, config: ModelConfig, expert_size: int,
                capacity_factor: float | None = None) -> int:
    """Per-destination capacity C: worst case (dropless) or ceil(cf * T_l * k / N)."""
    k, e_local = config.num_experts_per_tok, config.num_experts // expert_size
    worst = tokens_per_device * min(k, e_local)
    if capacity_factor is None:
        return worst
    return max(1, min(worst, math.ceil(capacity_factor * tokens_per_device * k / expert_size)))


def expert_parallel_moe(weights: dict, config: ModelConfig, x: jax.Array, mesh: Mesh, *,
                        bias: jax.Array | None = None, expert_axis: str = "expert", data_axis: str = "data",
                        capacity_factor: float | None = None, dispatch: str = "all_to_all"
                        ) -> tuple[jax.Array, EPStats]:
    """The MoE block (``MoEBlock``'s params ``weights``) over ``mesh``: x [T, H] -> (y [T, H], EPStats).

    T must divide evenly over the token axes (data x expert). bias: f32[E] selection bias or None.
    """
    n, shards = _validate(config, x, mesh, expert_axis, data_axis, dispatch)
    t_local = x.shape[0] // shards
    cap = ep_capacity(t_local, config, n, capacity_factor)
    tok = P(token_axes(mesh, (data_axis, expert_axis)))
    w_specs = {name: P(expert_axis) if name in ("gate_proj", "up_proj", "down_proj") else P()
               for name in weights}
    bias = jnp.zeros(config.num_experts, jnp.float32) if bias is None else bias
    body = partial(_local_moe, config=config, axis=expert_axis, token_axes=tok[0], capacity=cap,
                   ragged=dispatch == "ragged")
    fn = jax.shard_map(body, mesh=mesh, in_specs=(w_specs, tok, P()), out_specs=(tok, P(), P()),
                       check_vma=False)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))
    weights = {k: jax.tree_util.tree_map(lambda a, s=w_specs[k]: put(a, s), v) for k, v in weights.items()}
    y, load, dropped = fn(weights, put(x, tok), put(bias, P()))
    sent = shards * n * cap * x.shape[-1] * x.dtype.itemsize
    return y, EPStats(load, dropped, cap, sent)


def _check_dispatch(dispatch: str) -> None:
    if dispatch not in DISPATCH:
        raise ValueError(f"dispatch must be one of {DISPATCH}, got {dispatch!r}")


def _validate(config, x, mesh, expert_axis, data_axis, dispatch) -> tuple[int, int]:
    _check_dispatch(dispatch)
    n = require_axis(mesh, expert_axis)
    e, k = config.num_experts, config.num_experts_per_tok
    if not 1 <= k <= e:
        raise ValueError(f"num_experts_per_tok={k} must be in [1, num_experts={e}]")
    if e % n:
        raise ValueError(f"num_experts={e} is not divisible by the size {n} of mesh axis {expert_axis!r}")
    shards = math.prod(mesh.shape[a] for a in token_axes(mesh, (data_axis, expert_axis)))
    if x.ndim != 2 or x.shape[0] % shards:
        raise ValueError(f"x must be [T, H] with T divisible by the {shards} token shards "
                         f"(axes {token_axes(mesh, (data_axis, expert_axis))}), got shape {x.shape}")
    return n, shards


def _local_moe(weights, x, bias, *, config: ModelConfig, axis: str, token_axes, capacity: int, ragged: bool):
    """Per-device body: x [T_l, H] -> (y [T_l, H], load f32[E], dropped i32[])."""
    r = route(router_logits(weights, x), config, bias)
    y, dropped = _dispatch_combine(weights, x, r.experts, r.gates, config=config, axis=axis, capacity=capacity,
                                   ragged=ragged)
    if config.num_shared_experts:
        y = y + shared_output(weights, config, x)
    load = jax.lax.psum(expert_load(r.experts, config.num_experts), token_axes)
    return y, load, jax.lax.psum(dropped, token_axes)


def _dispatch_combine(weights, x, experts, gates, *, config: ModelConfig, axis, capacity: int, ragged: bool):
    """x [T_l, H] routed to ``experts`` i32[T_l, k] with ``gates`` [T_l, k] -> (y [T_l, H], dropped i32[] here)."""
    n = jax.lax.axis_size(axis)
    e_local = config.num_experts // n
    t, k = experts.shape
    flat = experts.reshape(-1)  # [A] in token order
    token = jnp.arange(t * k) // k
    dest, local_id = flat // e_local, flat % e_local
    onehot = jax.nn.one_hot(dest, n, dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)  # position within its destination
    kept = slot < capacity
    at = (dest, jnp.where(kept, slot, capacity))
    send_x = jnp.zeros((n, capacity, x.shape[-1]), x.dtype).at[at].set(x[token], mode="drop")
    send_id = jnp.full((n, capacity), e_local, jnp.int32).at[at].set(local_id, mode="drop")  # e_local: empty

    exchange = _ragged_exchange if ragged else _padded_exchange
    back = exchange(send_x, send_id, lambda rx, rid: _local_experts(weights, rx, rid, e_local), axis, e_local)
    rows = back[dest, jnp.minimum(slot, capacity - 1)]  # [A, H]
    y = jnp.zeros_like(x).at[token].add(rows * (gates.reshape(-1) * kept)[:, None].astype(x.dtype))
    return y, jnp.sum(~kept).astype(jnp.int32)


def expert_parallel_routed(weights: dict, config: ModelConfig, x: jax.Array, bias: jax.Array | None = None, *,
                           mesh: Mesh, axes: tuple[str, ...], dispatch: str = "all_to_all"
                           ) -> tuple[jax.Array, RouterStats]:
    """The routed part of an MoE block inside a jitted step, its experts split over mesh ``axes``.

    x [T, H] (any sharding; T any size: padded to the N = prod(axes) token shards); the expert banks
    ``weights[gate_proj|up_proj|down_proj]`` are split on E over ``axes``. Routing runs replicated (it is
    small and gives exact ``RouterStats``); each device then dispatches its T/N tokens with ``all_to_all``
    (``dispatch="ragged"``: ``ragged_all_to_all``, GPU/TPU only), runs its E/N experts and combines back
    (dropless). Returns (y [T, H], RouterStats), as ``routed_experts``.
    """
    _check_dispatch(dispatch)
    n = math.prod(mesh.shape[a] for a in axes)
    whole = NamedSharding(mesh, P())  # keeps GSPMD from splitting the dense layers' tokens over the data axis
    x = jax.lax.with_sharding_constraint(x, whole)
    r = route(router_logits(weights, x), config, bias)
    t = x.shape[0]
    pad = (-t) % n  # padding tokens carry zero gates: their rows cost capacity, never output
    padded = [jnp.pad(a, ((0, pad), (0, 0))) for a in (x, r.experts, r.gates)]
    cap = ep_capacity((t + pad) // n, config, n)

    def local(banks, xs, experts, gates):
        y, dropped = _dispatch_combine(banks, xs, experts, gates, config=config, axis=axes, capacity=cap,
                                       ragged=dispatch == "ragged")
        return y, jax.lax.psum(dropped, axes)

    banks = {name: weights[name] for name in ("gate_proj", "up_proj", "down_proj")}
    fn = jax.shard_map(local, mesh=mesh, in_specs=({name: P(axes) for name in banks}, P(axes), P(axes), P(axes)),
                       out_specs=(P(axes), P()), check_vma=False)
    y, dropped = fn(banks, *padded)
    return jax.lax.with_sharding_constraint(y[:t], whole), RouterStats(expert_load(r.experts, config.num_experts), r.probs, r.experts, dropped)


def _local_experts(weights, rows: jax.Array, ids: jax.Array, e_local: int) -> jax.Array:
    """rows [M, H] with local expert ids i32[M] (e_local = empty row) -> expert outputs [M, H]."""
    order = jnp.argsort(ids, stable=True)  # empty rows sort last and get zeros from ragged_dot
    sizes = jnp.bincount(ids, length=e_local).astype(jnp.int32)
    out = grouped_swiglu(rows[order], sizes, weights["gate_proj"], weights["up_proj"], weights["down_proj"])
    return jnp.zeros_like(out).at[order].set(out)


def _padded_exchange(send_x, send_id, compute, axis, e_local):
    n, cap, h = send_x.shape
    recv_x = jax.lax.all_to_all(send_x, axis, 0, 0)  # [N, C, H]: row m came from device m
    recv_id = jax.lax.all_to_all(send_id, axis, 0, 0)
    out = compute(recv_x.reshape(n * cap, h), recv_id.reshape(n * cap)).reshape(n, cap, h)
    return jax.lax.all_to_all(out, axis, 0, 0)  # row m: my assignments' results from device m


def _ragged_exchange(send_x, send_id, compute, axis, e_local):
    """As ``_padded_exchange`` but moving only live rows (GPU/TPU; XLA:CPU lacks ragged_all_to_all).

    M[src, dst] = live rows src sends dst. Dispatch packs what each device receives contiguously,
    source by source; combine returns each block to its source at offset (sender index) * C, so
    the result has the padded path's [N, C, H] layout.
    """
    n, cap, h = send_x.shape
    me = jax.lax.axis_index(axis)
    sizes = jnp.sum(send_id != e_local, axis=1).astype(jnp.int32)  # [N]: live rows are each chunk's prefix
    m = jax.lax.all_gather(sizes, axis)  # [N src, N dst]
    recv_sizes = m[:, me]
    send_offsets = jnp.arange(n, dtype=jnp.int32) * cap
    land_offsets = jnp.sum(jnp.where(jnp.arange(n)[:, None] < me, m, 0), axis=0).astype(jnp.int32)
    flat_x, flat_id = send_x.reshape(n * cap, h), send_id.reshape(n * cap)
    a2a = partial(jax.lax.ragged_all_to_all, axis_name=axis)
    recv_x = a2a(flat_x, jnp.zeros_like(flat_x), send_offsets, sizes, land_offsets, recv_sizes)
    recv_id = a2a(flat_id, jnp.full_like(flat_id, e_local), send_offsets, sizes, land_offsets, recv_sizes)
    out = compute(recv_x, recv_id)
    recv_offsets = (jnp.cumsum(recv_sizes) - recv_sizes).astype(jnp.int32)
    back = a2a(out, jnp.zeros_like(flat_x), recv_offsets, recv_sizes, jnp.full((n,), me * cap, jnp.int32), sizes)
    return back.reshape(n, cap, h)


def exchange_only(mesh: Mesh, expert_axis: str = "expert", data_axis: str = "data"):
    """Jitted dispatch + combine alone (no routing, no experts), for timing the communication.

    Takes the send buffers of all devices, f32[D * N, C, H] (D devices), split over the token axes;
    returns what comes back after an all_to_all there and back: the same values.
    """
    require_axis(mesh, expert_axis)
    spec = P(token_axes(mesh, (data_axis, expert_axis)))

    def body(buf):
        there = jax.lax.all_to_all(buf, expert_axis, 0, 0)
        return jax.lax.all_to_all(there * 1.0, expert_axis, 0, 0)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
