"""Logits -> tokens: greedy, temperature, top-k, top-p, with per-request random streams.

Axis names: R sample rows, V vocabulary.

Each row's key is derived from (seed, sample index, position) only, so a request with a fixed
seed draws the same tokens whatever else shares its batch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class SamplingBatch:
    temperature: jax.Array  # f32[R]; 0 = greedy
    top_k: jax.Array  # i32[R]; 0 = off
    top_p: jax.Array  # f32[R]; 1 = off
    seed: jax.Array  # u32[R]
    index: jax.Array  # i32[R]: sample number within the request
    position: jax.Array  # i32[R]: position of the token being drawn


def row_keys(seed: jax.Array, index: jax.Array, position: jax.Array) -> jax.Array:
    def key(s, i, p):
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(s), i), p)
    return jax.vmap(key)(seed, index, position)


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks (to -inf) tokens outside each row's top-k and nucleus top-p; f32[R, V]."""
    vocab = logits.shape[-1]
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(sorted_logits, (k - 1)[:, None], axis=-1)
    probs = jax.nn.softmax(jnp.where(sorted_logits >= kth, sorted_logits, -jnp.inf), axis=-1)
    # keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it < top_p
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = (mass_before < top_p[:, None]) & (sorted_logits >= kth)
    cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= cutoff, logits, -jnp.inf)


def sample(logits: jax.Array, batch: SamplingBatch) -> tuple[jax.Array, jax.Array]:
    """logits f32[R, V] -> (tokens i32[R], log-probs f32[R] of those tokens under the raw logits)."""
    logits = logits.astype(jnp.float32)
    greedy = batch.temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, batch.temperature)[:, None]
    filtered = filter_logits(scaled, batch.top_k, batch.top_p)
    keys = row_keys(batch.seed, batch.index, batch.position)
    drawn = jax.vmap(jax.random.categorical)(keys, filtered)
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
    logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
    return tokens, logprobs
