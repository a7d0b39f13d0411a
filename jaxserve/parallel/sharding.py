"""Sharding rules: which mesh axis splits which dimension of each parameter.

A rule is ``(regex over the "/"-joined params path, spec)``; the first match wins and the spec
names one logical axis (or None) per array dimension. ``axis_map`` turns a logical axis into mesh
axes (one name, a tuple of names, or None); by default a logical axis is the mesh axis of the same
name. Axes the mesh lacks become None (replicated), so one rule set serves a pure data-parallel
mesh, an expert-parallel one and a tensor-parallel one.

A quantized kernel (a ``QuantizedTensor``, ``jaxserve.quant``) is split as its float kernel would be: its
packed codes and block scales on the same dimensions (a dimension of size 1, fp8's per-tensor scale, stays
whole) and its tensor scale replicated, so every shard dequantizes with the one scale computed over the
whole kernel. A split of the quantized dimension K (row-parallel o/down) must fall on whole scale blocks.

Defaults: MoE expert weights ``[E, ...]`` split over ``"expert"`` and each expert's intermediate
dimension I over ``"expert_tensor"`` (vLLM's tensor-parallel experts: gate/up ``[E, H, I]`` column-split,
down ``[E, I, H]`` row-split; a layout maps it to the tensor axis when the experts are not expert-
parallel); Megatron-style ``"tensor"`` splits of the dense layers (column-parallel q/k/v/gate/up and the
q/k/v biases, row-parallel o/down); everything else (norms, embeddings, routers, the lm head, other
biases) replicated.
"""
from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pallas_kernels.fp4 import QuantizedTensor

Rule = tuple[str, tuple[str | None, ...]]
AxisMap = Mapping[str, str | tuple[str, ...] | None]

DEFAULT_RULES: tuple[Rule, ...] = (
    (r".*/mlp/(gate_proj|up_proj)$", ("expert", None, "expert_tensor")),  # stacked experts [E, H, I]
    (r".*/mlp/down_proj$", ("expert", "expert_tensor", None)),  # [E, I, H]
    (r".*/(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", (None, "tensor")),
    (r".*/(q_proj|k_proj|v_proj)/bias$", ("tensor",)),
    (r".*/(o_proj|down_proj)/kernel$", ("tensor", None)),
)


def _mesh_axes(logical, mesh: Mesh, axis_map: AxisMap | None):
    """A logical axis -> the mesh axes it splits over (None: replicated), those the mesh lacks dropped."""
    if logical is None:
        return None
    axes = axis_map.get(logical) if axis_map is not None else logical
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    names = tuple(a for a in names if a in mesh.axis_names)
    return None if not names else names[0] if len(names) == 1 else names


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES,
             axis_map: AxisMap | None = None) -> P:
    """PartitionSpec of one array; ValueError when a split dimension does not divide evenly."""
    for pattern, axes in rules:
        if re.fullmatch(pattern, path):
            break
    else:
        return P()
    axes = tuple(_mesh_axes(a, mesh, axis_map) for a in axes)
    for dim, (size, axis) in enumerate(zip(shape, axes)):
        ways = axis_ways(axis, mesh)
        if size % ways:
            raise ValueError(f"{path}: dimension {dim} of size {size} is not divisible by mesh axis "
                             f"{axis!r} of size {ways}")
    return P(*axes)


def axis_ways(axis, mesh: Mesh) -> int:
    """How many ways mesh ``axis`` (a name, a tuple of names, or None) splits a dimension."""
    return math.prod(mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis or ()))


def quantized_spec(path: str, qt: QuantizedTensor, spec: P, mesh: Mesh) -> QuantizedTensor:
    """The float kernel's ``spec`` applied to ``qt``'s arrays (a QuantizedTensor holding PartitionSpecs);
    ValueError when a split of the quantized dimension does not fall on whole scale blocks."""
    axes = tuple(spec) + (None,) * (len(qt.shape) - len(spec))
    split, k = axes[qt.axis], qt.shape[qt.axis]
    # fp8's scale is per tensor or per column, never in blocks along K
    if split is not None and qt.fmt != "fp8" and (k // qt.block_size) % axis_ways(split, mesh):
        ways = axis_ways(split, mesh)
        raise ValueError(f"{path}: its {qt.fmt} kernel splits K={k} over mesh axis {split!r} of size {ways} "
                         f"({k / ways:g} per device), which must be a multiple of the {qt.fmt} block size "
                         f"{qt.block_size}")

    def fit(x):  # a size-1 dimension is a broadcast scale: whole on every device
        return P(*(a if n > 1 else None for a, n in zip(axes, x.shape)))

    return qt.replace(data=fit(qt.data), scales=fit(qt.scales), tensor_scale=P())


def param_specs(params, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES, axis_map: AxisMap | None = None):
    """The params pytree mapped to PartitionSpecs (a QuantizedTensor to one holding its arrays' specs)."""
    def one(kp, x):
        path = "/".join(str(getattr(k, "key", k)) for k in kp)
        spec = spec_for(path, x.shape, mesh, rules, axis_map)
        return quantized_spec(path, x, spec, mesh) if isinstance(x, QuantizedTensor) else spec

    return jax.tree_util.tree_map_with_path(one, params, is_leaf=lambda x: isinstance(x, QuantizedTensor))


def shard_params(params, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES, axis_map: AxisMap | None = None):
    """Places every parameter on ``mesh`` according to ``rules``."""
    specs = param_specs(params, mesh, rules, axis_map)
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)


def token_axes(mesh: Mesh, names: Sequence[str] = ("data", "expert")) -> tuple[str, ...]:
    """The mesh axes a batch of tokens is split over: those of ``names`` the mesh has."""
    return tuple(n for n in names if n in mesh.axis_names)
