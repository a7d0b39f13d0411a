"""Device meshes with named axes, in JAX's Auto sharding mode.

Axis names used by jaxserve: ``"data"`` (batch / tokens), ``"expert"`` (MoE experts; tokens are
split over it too), ``"tensor"`` (Megatron-style splits of dense layers).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh


def make_mesh(axes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """``make_mesh({"data": 2, "expert": 4})`` -> a Mesh over the first 8 devices, Auto axis types.

    ``jax.make_mesh`` defaults to Explicit axes in jax >= 0.9; jaxserve shards with Auto axes and
    ``shard_map``, so the types are set here once.
    """
    if not axes:
        raise ValueError("make_mesh needs at least one axis, got {}")
    for name, size in axes.items():
        if size < 1:
            raise ValueError(f"mesh axis {name!r} must have size >= 1, got {size}")
    devices = list(jax.devices() if devices is None else devices)
    need = math.prod(axes.values())
    if need > len(devices):
        raise ValueError(f"mesh {dict(axes)} needs {need} devices, only {len(devices)} available")
    return jax.make_mesh(tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes),
                         devices=devices[:need])


def require_axis(mesh: Mesh, name: str) -> int:
    """Size of mesh axis ``name``; ValueError naming the mesh's axes when it has none such."""
    if name not in mesh.axis_names:
        raise ValueError(f"mesh axis {name!r} missing: the mesh has axes {dict(mesh.shape)}")
    return mesh.shape[name]
