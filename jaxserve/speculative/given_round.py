"""One speculative round over drafts made elsewhere (on the host): suffix decoding's device side.

Axis names: B sequences, G draft slots (γ).

The proposals arrive as inputs, ``drafts`` i32[B, G] with ``num_drafts`` i32[B] in [0, G]: row b
proposed ``drafts[b, :num_drafts[b]]`` (``jaxserve.speculative.suffix_tree``), the rest is padding.
The round is n-gram's: one target pass over [last, drafts] and the exact rule with the one-hot q of
a deterministic proposal; a padded slot is never accepted and the draw at a row's first padded slot
is from p itself, so a row with no drafts decodes one token exactly as a plain step would. The
shapes stay [B, G+1] whatever the lengths (one program per bucket): padding costs verify compute,
never correctness.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.parallel.layout import Layout
from jaxserve.speculative.rejection import given_draft_uniforms
from jaxserve.speculative.round import RoundInputs, RoundOutputs, accept_and_advance, target_verify


def suffix_round(target_params: dict, target_pool: KVPool, inputs: RoundInputs, drafts: jax.Array,
                 num_drafts: jax.Array, *, target_config: ModelConfig, max_gamma: int | None = None,
                 attention_impl: str = "auto", layout: Layout | None = None) -> RoundOutputs:
    """``spec_round`` with given drafts i32[B, G] of per-row lengths num_drafts i32[B]; no draft pool.
    ``max_gamma`` (None: G): the widest round the caller runs; the randomness is drawn for it, so a row's
    sample does not depend on G (see ``given_draft_uniforms``)."""
    s = inputs.sampling
    gamma = drafts.shape[1]
    max_gamma = gamma if max_gamma is None else max_gamma
    if not 0 <= gamma <= max_gamma:
        raise ValueError(f"suffix_round: drafts are {gamma} wide, past max_gamma={max_gamma}")
    u = given_draft_uniforms(s.seed, s.index, inputs.positions + 1, gamma, max_gamma, target_config.vocab_size,
                             jnp.all(s.temperature <= 0))
    num_drafts = jnp.clip(num_drafts, 0, gamma).astype(jnp.int32)
    padded = jnp.arange(gamma)[None, :] >= num_drafts[:, None]
    x = jnp.where(padded, inputs.last_tokens[:, None], drafts).astype(jnp.int32)  # any valid id in the padding
    logits, target_pool = target_verify(target_params, target_config, target_pool, inputs, x, attention_impl, layout)
    return accept_and_advance(inputs, x, None, logits, u, target_pool, None, num_drafts)
