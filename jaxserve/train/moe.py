"""A training step for MoE models that carries the router state, for balancing experiments.

Axis names: B sequences, L window length (+1 for the shifted targets), E experts.

``jaxserve.train`` trains dense models from ``params`` alone; an MoE model under loss-free balancing
also carries ``router_state`` (the selection biases, ``jaxserve/moe/balancing.py``), updated after
each optimizer step from that step's per-layer loads and never seen by the optimizer.

Balancing modes: ``"none"``; ``"aux"`` (Switch loss ``alpha * E * sum f_i P_i`` per MoE layer, added
to the loss); ``"loss_free"`` (bias update ``b_i += rate * sign(mean load - load_i)``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxserve.config import ModelConfig
from jaxserve.models.likelihood import nll_and_stats
from jaxserve.moe.balancing import (accumulate_loads, aux_loss, layer_loads, max_violation,
                                    update_router_state)

BALANCING = ("none", "aux", "loss_free")


def make_moe_train_step(config: ModelConfig, optimizer: optax.GradientTransformation, balancing: str,
                        alpha: float = 1e-3, rate: float = 1e-3):
    """Jitted ``step(params, router_state, opt_state, windows i32[B, L+1]) -> (params, router_state,
    opt_state, metrics)``; metrics: ``loss`` (mean NLL), ``max_vio`` (MaxVio_batch averaged over layers)."""
    if balancing not in BALANCING:
        raise ValueError(f"balancing must be one of {BALANCING}, got {balancing!r}")

    def loss_fn(params, router_state, windows):
        nll, stats = nll_and_stats(params, router_state, config, windows)
        extra = aux_loss(stats, "switch", alpha) if balancing == "aux" else 0.0
        return jnp.mean(nll) + extra, (jnp.mean(nll), layer_loads(stats))

    @jax.jit
    def step(params, router_state, opt_state, windows):
        (_, (nll, loads)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, router_state, windows)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if balancing == "loss_free":
            router_state = update_router_state(router_state, loads, rate)
        vio = jnp.mean(jnp.stack([max_violation(v) for v in loads.values()]))
        return params, router_state, opt_state, {"loss": nll, "max_vio": vio}

    return step


def evaluate_balance(params, router_state, config: ModelConfig, windows: np.ndarray, batch_size: int = 16) -> dict:
    """Held-out NLL, perplexity and MaxVio_global (loads accumulated over all windows, mean over layers)."""
    fn = jax.jit(lambda w: (lambda nll, st: (jnp.sum(nll), layer_loads(st)))(
        *nll_and_stats(params, router_state, config, w)))
    total, n, loads = 0.0, 0, None
    for i in range(0, len(windows) - batch_size + 1, batch_size):
        s, batch_loads = fn(jnp.asarray(windows[i:i + batch_size]))
        total, n = total + float(s), n + batch_size * (windows.shape[1] - 1)
        loads = accumulate_loads(loads, batch_loads)
    vio = float(np.mean([float(max_violation(v)) for v in loads.values()]))
    return {"val_nll": total / n, "val_ppl": float(np.exp(total / n)), "max_vio_global": vio}
