"""Log-likelihood of token windows under a model: the loss of training and the measure of evaluation.

Axis names: B sequences, L window length (the shifted targets make it L-1 positions).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import Transformer, forward_full


def token_nll(params: dict, config: ModelConfig, windows: jax.Array, router_state: dict | None = None) -> jax.Array:
    """Next-token negative log-likelihood f32[B, L-1] of windows i32[B, L]."""
    logits = forward_full(params, config, windows[:, :-1], router_state=router_state or None)
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])


def nll_and_stats(params, router_state, config: ModelConfig, windows):
    """Next-token NLL f32[B, L] of windows i32[B, L+1] and the forward's ``"moe_stats"`` collection."""
    tokens, targets = windows[:, :-1], windows[:, 1:]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    (logits, _), st = Transformer(config).apply({"params": params, "router_state": router_state}, tokens,
                                                positions, mutable=["moe_stats"])
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return nll, st["moe_stats"]
