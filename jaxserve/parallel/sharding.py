"""Sharding rules: which mesh axis splits which dimension of each parameter.

A rule is ``(regex over the "/"-joined params path, spec)``; the first match wins and the spec
names one mesh axis (or None) per array dimension. Axes the mesh lacks become None (replicated),
so one rule set serves a pure data-parallel mesh, an expert-parallel one and a tensor-parallel one.

Defaults: MoE expert weights ``[E, ...]`` split over ``"expert"``; Megatron-style ``"tensor"``
splits of the dense layers (column-parallel q/k/v/gate/up, row-parallel o/down); everything else
(norms, embeddings, routers, biases) replicated.
"""
from __future__ import annotations

import re
from typing import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

Rule = tuple[str, tuple[str | None, ...]]

DEFAULT_RULES: tuple[Rule, ...] = (
    (r".*/mlp/(gate_proj|up_proj|down_proj)$", ("expert", None, None)),  # stacked experts [E, ., .]
    (r".*/(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", (None, "tensor")),
    (r".*/(o_proj|down_proj)/kernel$", ("tensor", None)),
)


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES) -> P:
    """PartitionSpec of one array; ValueError when a split dimension does not divide evenly."""
    for pattern, axes in rules:
        if re.fullmatch(pattern, path):
            break
    else:
        return P()
    axes = tuple(a if a in mesh.axis_names else None for a in axes)
    for dim, (size, axis) in enumerate(zip(shape, axes)):
        if axis is not None and size % mesh.shape[axis]:
            raise ValueError(f"{path}: dimension {dim} of size {size} is not divisible by mesh axis "
                             f"{axis!r} of size {mesh.shape[axis]}")
    return P(*axes)


def param_specs(params, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES):
    """The params pytree mapped to PartitionSpecs."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, x: spec_for("/".join(str(getattr(k, "key", k)) for k in kp), x.shape, mesh, rules), params)


def shard_params(params, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES):
    """Places every parameter on ``mesh`` according to ``rules``."""
    specs = param_specs(params, mesh, rules)
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)


def token_axes(mesh: Mesh, names: Sequence[str] = ("data", "expert")) -> tuple[str, ...]:
    """The mesh axes a batch of tokens is split over: those of ``names`` the mesh has."""
    return tuple(n for n in names if n in mesh.axis_names)
