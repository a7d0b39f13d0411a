"""Parallelism: meshes with named axes, sharding rules for params, the engine's layout, multi-process start-up."""
from typing import TYPE_CHECKING

from jaxserve.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DEFAULT_RULES": "jaxserve.parallel.sharding",
    "Layout": "jaxserve.parallel.layout",
    "collectives": "jaxserve.parallel.hlo",
    "make_layout": "jaxserve.parallel.layout",
    "make_mesh": "jaxserve.parallel.mesh",
    "param_specs": "jaxserve.parallel.sharding",
    "require_axis": "jaxserve.parallel.mesh",
    "shard_params": "jaxserve.parallel.sharding",
    "spec_for": "jaxserve.parallel.sharding",
    "token_axes": "jaxserve.parallel.sharding",
})

if TYPE_CHECKING:
    from jaxserve.parallel.hlo import collectives
    from jaxserve.parallel.layout import Layout, make_layout
    from jaxserve.parallel.mesh import make_mesh, require_axis
    from jaxserve.parallel.sharding import DEFAULT_RULES, param_specs, shard_params, spec_for, token_axes
