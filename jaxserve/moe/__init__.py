"""Mixture-of-Experts: routers, load balancing, grouped-matmul experts, expert parallelism.

Axis names used throughout: T tokens, H hidden, I expert intermediate size, E experts, k experts
per token. ``MoEBlock`` is what the model family uses for its MoE layers (``ModelConfig.num_experts``);
``expert_parallel_moe`` (``jaxserve.moe.parallel``) runs the same block over a device mesh.
"""
from typing import TYPE_CHECKING

from jaxserve.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "MoEBlock": "jaxserve.moe.layer",
    "RouterStats": "jaxserve.moe.balancing",
    "Routing": "jaxserve.moe.routers",
    "accumulate_loads": "jaxserve.moe.balancing",
    "aux_loss": "jaxserve.moe.balancing",
    "capacity_experts": "jaxserve.moe.experts",
    "expert_capacity": "jaxserve.moe.experts",
    "expert_load": "jaxserve.moe.balancing",
    "grouped_swiglu": "jaxserve.moe.experts",
    "init_router_state": "jaxserve.moe.balancing",
    "layer_loads": "jaxserve.moe.balancing",
    "max_violation": "jaxserve.moe.balancing",
    "ragged_experts": "jaxserve.moe.experts",
    "route": "jaxserve.moe.routers",
    "routed_experts": "jaxserve.moe.layer",
    "router_logits": "jaxserve.moe.layer",
    "sequence_aux_loss": "jaxserve.moe.balancing",
    "shared_experts": "jaxserve.moe.layer",
    "shared_output": "jaxserve.moe.layer",
    "switch_aux_loss": "jaxserve.moe.balancing",
    "update_bias": "jaxserve.moe.balancing",
    "update_router_state": "jaxserve.moe.balancing",
})

if TYPE_CHECKING:
    from jaxserve.moe.balancing import (RouterStats, accumulate_loads, aux_loss, expert_load, init_router_state,
                                        layer_loads, max_violation, sequence_aux_loss, switch_aux_loss,
                                        update_bias, update_router_state)
    from jaxserve.moe.experts import capacity_experts, expert_capacity, grouped_swiglu, ragged_experts
    from jaxserve.moe.layer import MoEBlock, routed_experts, router_logits, shared_experts, shared_output
    from jaxserve.moe.routers import Routing, route
