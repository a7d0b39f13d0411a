"""N-gram prompt lookup: proposals copied from the sequence's own history, no draft model.

Axis names: B sequences, H history slots (token at position t in slot t), G draft tokens (γ).

The proposal continues the latest earlier occurrence of the sequence's last n tokens (n from
``max_ngram`` down to ``min_ngram``), extended periodically past the present. The proposal is
deterministic, so its q is one-hot and the same exact rejection rule applies: accept x with
probability p(x), correct from p with x removed. Rows without a match propose their last token
repeated (cheap to reject).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.parallel.layout import Layout
from jaxserve.speculative.rejection import round_uniforms
from jaxserve.speculative.round import RoundInputs, RoundOutputs, accept_and_advance, target_verify


def _latest_match(history: jax.Array, last: jax.Array, n: int) -> jax.Array:
    """Per row, the start of the latest earlier occurrence of history[last-n+1 : last+1]; -1 if none."""
    h = history.shape[1]
    key = jnp.take_along_axis(history, jnp.clip(last[:, None] - n + 1 + jnp.arange(n), 0, h - 1), axis=1)
    starts = jnp.arange(h - n + 1)
    windows = history[:, starts[:, None] + jnp.arange(n)[None, :]]  # [B, h-n+1, n]
    hit = (windows == key[:, None, :]).all(-1) & (starts[None, :] + n <= last[:, None]) & (last[:, None] >= n - 1)
    return jnp.max(jnp.where(hit, starts[None, :], -1), axis=1)


def ngram_propose(history: jax.Array, last: jax.Array, gamma: int, max_ngram: int = 3,
                  min_ngram: int = 1) -> tuple[jax.Array, jax.Array]:
    """history i32[B, H] valid at [0, last]; last i32[B] -> (proposals i32[B, G], matched n i32[B], 0 if none)."""
    cont = jnp.full(last.shape, -1, jnp.int32)
    found = jnp.zeros(last.shape, jnp.int32)
    for n in range(max_ngram, min_ngram - 1, -1):  # longest match wins
        start = _latest_match(history, last, n)
        take = (found == 0) & (start >= 0)
        cont = jnp.where(take, start + n, cont)
        found = jnp.where(take, n, found)
    period = jnp.maximum(last + 1 - cont, 1)  # the match repeats the recent past with this period
    idx = jnp.where(found[:, None] > 0, cont[:, None] + jnp.arange(gamma)[None, :] % period[:, None], last[:, None])
    return jnp.take_along_axis(history, idx, axis=1), found


def ngram_round(target_params: dict, target_pool: KVPool, inputs: RoundInputs, history: jax.Array, *,
                target_config: ModelConfig, gamma: int, max_ngram: int = 3, min_ngram: int = 1,
                attention_impl: str = "auto", layout: Layout | None = None) -> RoundOutputs:
    """``spec_round`` with n-gram proposals from history i32[B, H] (valid at [0, positions]); no draft pool."""
    s = inputs.sampling
    u = round_uniforms(s.seed, s.index, inputs.positions + 1, gamma, target_config.vocab_size,
                       jnp.all(s.temperature <= 0))
    x, _ = ngram_propose(history, inputs.positions, gamma, max_ngram, min_ngram)
    logits, target_pool = target_verify(target_params, target_config, target_pool, inputs, x, attention_impl, layout)
    return accept_and_advance(inputs, x, None, logits, u, target_pool, None)
