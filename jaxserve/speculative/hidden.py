"""The target's serving step that also returns its last hidden state (what Medusa heads read).

Axis names: T packed tokens, E hidden size, V vocabulary.
"""
from __future__ import annotations

import jax

from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.models.attention import AttentionMetadata
from jaxserve.models.transformer import Transformer
from jaxserve.parallel.layout import Layout


def forward_with_hidden(params: dict, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
                        kv_pool: KVPool, meta: AttentionMetadata, *, attention_impl: str = "auto",
                        logits_indices: jax.Array | None = None, layout: Layout | None = None,
                        all_hidden: bool = False, hidden_only: bool = False) -> tuple[jax.Array, jax.Array, KVPool]:
    """``transformer.forward`` plus the final-norm output [T or len(logits_indices), E] (every token's with
    ``all_hidden``, while the logits are still only ``logits_indices``'), in the model's dtype. ``hidden_only``:
    ``forward``'s, the first result is the final-normed hidden f32 at ``logits_indices`` instead of the logits (a
    caller that applies the head itself).

    The hidden state is the input of the LM head, captured from the ``final_norm`` module, so
    the model code needs no extra output. ``layout``: the device mesh, as for ``forward``.
    """
    (logits, kv_pool), state = Transformer(config, attention_impl, layout, hidden_only).apply(
        {"params": params}, tokens, positions, kv_pool, meta, logits_indices,
        capture_intermediates=lambda module, _: module.name == "final_norm")
    hidden = state["intermediates"]["final_norm"]["__call__"][0]
    if logits_indices is not None and not all_hidden:
        hidden = hidden[logits_indices]
    return logits, hidden, kv_pool


def full_hidden(params: dict, config: ModelConfig, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Causal forward with no cache: tokens i32[B, L] -> (logits f32[B, L, V], hidden [B, L, E])."""
    positions = jax.numpy.broadcast_to(jax.numpy.arange(tokens.shape[1]), tokens.shape)
    (logits, _), state = Transformer(config).apply(
        {"params": params}, tokens, positions, capture_intermediates=lambda module, _: module.name == "final_norm")
    return logits, state["intermediates"]["final_norm"]["__call__"][0]
