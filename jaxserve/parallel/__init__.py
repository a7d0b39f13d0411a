"""Parallelism: meshes with named axes, sharding rules for params, multi-process start-up."""
from jaxserve.parallel.mesh import make_mesh, require_axis
from jaxserve.parallel.sharding import DEFAULT_RULES, param_specs, shard_params, spec_for, token_axes

__all__ = ["DEFAULT_RULES", "make_mesh", "param_specs", "require_axis", "shard_params", "spec_for", "token_axes"]
