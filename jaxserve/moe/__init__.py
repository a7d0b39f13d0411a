"""Mixture-of-Experts: routers, load balancing, grouped-matmul experts, expert parallelism.

Axis names used throughout: T tokens, H hidden, I expert intermediate size, E experts, k experts
per token. ``MoEBlock`` is what the model family uses for its MoE layers (``ModelConfig.num_experts``);
``expert_parallel_moe`` (``jaxserve.moe.parallel``) runs the same block over a device mesh.
"""
from jaxserve.moe.balancing import (RouterStats, accumulate_loads, aux_loss, expert_load, init_router_state,
                                    layer_loads, max_violation, sequence_aux_loss, switch_aux_loss,
                                    update_bias, update_router_state)
from jaxserve.moe.experts import capacity_experts, expert_capacity, grouped_swiglu, ragged_experts
from jaxserve.moe.layer import MoEBlock, routed_experts, router_logits, shared_experts, shared_output
from jaxserve.moe.routers import Routing, route

__all__ = ["MoEBlock", "RouterStats", "Routing", "accumulate_loads", "aux_loss", "capacity_experts", "expert_capacity",
           "expert_load", "grouped_swiglu", "init_router_state", "layer_loads", "max_violation",
           "ragged_experts", "route", "routed_experts", "router_logits", "sequence_aux_loss", "shared_experts",
           "shared_output", "switch_aux_loss", "update_bias", "update_router_state"]
