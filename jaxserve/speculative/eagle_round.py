"""One speculative round with an EAGLE draft (``jaxserve.speculative.eagle``), and the draft's pass over a fill.

Axis names: B sequences, G draft tokens per round (γ), T packed tokens, E hidden size, V vocabulary.

State between rounds, per row, with L = ``positions`` (the position of ``last_tokens``):
- the target pool holds K/V for [0, L), as in ``spec_round``;
- the draft pool holds K/V for [0, L), each position written from its true feature f_{p-1}, and with ``drafted``
  also for L (written from f_{L-1}, as a fill would);
- ``features`` f32[B, E]: the target's f_{L-1}, the LM head input that produced ``last_tokens``; or with
  ``drafted`` the draft's own f̂ at L (its output there, from which the first draft token is drawn).

A round drafts γ tokens in one-token draft steps at L .. L+γ-1 (the first reads f_{L-1}, the others the draft's
own f̂; a drafted row skips the first, whose output it carries), verifies them in one target pass that also returns
f_L .. f_{L+γ}, accepts n of them, and then runs the draft once over the emitted tokens at L+1 .. L+γ from those
true features (one γ-token pass): positions up to L+n now hold what a fill would have written, and when n < γ
also L+n+1, the next round's last token, whose output there is the next round's f̂ (the fix-up pass does the next
round's first draft step: drafted). Later positions are overwritten before anything attends to them. After a
round that accepts all γ the next round starts from f_{L+γ} (its last token's slot is past the round's). A fill
(prefill chunks, plain decodes) runs the draft over its tokens with each token's feature shifted by one within its
entry, the entry's first token reading the true feature carried from the entry's previous step (zeros at
position 0, or when it is not known: a prefix-cache hit); a fill leaves its rows not drafted. A plain decode step
of an engine whose policy switched speculation off skips the draft; the runner keeps each such token's feature
(``jaxserve.engine.draft_coverage``) and runs the draft over them before the sequence's next round
(``step_programs.draft_catch_up``), which leaves the draft's pool as those fills would have.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.kernels.cpu.packed import PackedBf16, packed_argmax
from jaxserve.models.attention import AttentionMetadata
from jaxserve.parallel.layout import Layout
from jaxserve.sampling import argmax_first
from jaxserve.speculative.draft_vocab import DraftHead
from jaxserve.speculative.eagle import draft_hidden, target_embed, target_head
from jaxserve.speculative.rejection import draw, round_uniforms
from jaxserve.speculative.round import (RoundInputs, RoundOutputs, accept_and_advance, multi_token_meta,
                                        row_probs, verify_with_hidden)


def _head_argmax(head: DraftHead, hidden: jax.Array) -> jax.Array:
    """The draft's greedy token i32[B]: the argmax over the head's N tokens of f̂ [B, E] (a kernel the runner packed
    for AMX tiles runs ``packed_argmax``: no [B, N] logits)."""
    if isinstance(head.kernel, PackedBf16):
        return head.token_ids[packed_argmax(hidden.astype(jnp.bfloat16), head.kernel)]
    logits = jnp.dot(hidden.astype(head.kernel.dtype), head.kernel, preferred_element_type=jnp.float32)
    return head.token_ids[argmax_first(logits)]


def _draw(fh, uniforms, inputs: RoundInputs, all_greedy, head, target_params, target_config):
    """One draft token i32[B] from f̂ [B, E] and the distribution f32[B, V] it came from (zeros when greedy)."""
    vocab = uniforms.shape[-1]

    def greedy():
        return _head_argmax(head, fh), jnp.zeros((fh.shape[0], vocab), jnp.float32)

    def sampled():
        q = row_probs(target_head(target_params, target_config, fh), inputs.sampling)
        return draw(q, uniforms, jnp.bool_(False)), q
    return jax.lax.cond(all_greedy, greedy, sampled)


def eagle_round(target_params: dict, draft_params: dict, target_pool: KVPool, draft_pool: KVPool,
                inputs: RoundInputs, features: jax.Array, drafted: jax.Array | None = None, *,
                target_config: ModelConfig, draft_config: ModelConfig, head: DraftHead, gamma: int,
                attention_impl: str = "auto", layout: Layout | None = None, first_step: bool = True) -> RoundOutputs:
    """Draft γ tokens with the EAGLE draft, verify, accept exactly, rewrite the draft's accepted K/V (module
    docstring). ``drafted`` bool[B] (None: none): rows whose ``features`` are the draft's f̂ at L. ``first_step``
    (static) False: every active row is drafted, and the draft's step at L is not run at all.
    The result's ``hidden`` f32[B, 2, E] holds each row's true f_{L'-1} (L' its next position: what a fill
    carries) and the next round's ``features``; its ``drafted`` bool[B] the next round's ``drafted``. Inactive rows
    keep their ``features`` (both) and ``drafted``."""
    s = inputs.sampling
    b = inputs.positions.shape[0]
    drafted = jnp.zeros(b, bool) if drafted is None else drafted
    all_greedy = jnp.all(s.temperature <= 0)
    u = round_uniforms(s.seed, s.index, inputs.positions + 1, gamma, target_config.vocab_size, all_greedy)
    block_size = draft_pool.page_size
    fh = features
    if first_step:  # the step at L for the rows not drafted (a drafted row's K/V there is kept: not written)
        pos = inputs.positions[:, None]
        run = inputs.replace(active=inputs.active & ~drafted)
        out, draft_pool = draft_hidden(draft_params, draft_config,
                                       target_embed(target_params, target_config, inputs.last_tokens), features,
                                       pos[:, 0], draft_pool, multi_token_meta(run, pos, block_size), attention_impl)
        fh = jnp.where(drafted[:, None], features, out)
    tok, q = _draw(fh, u[:, 0, :-1], inputs, all_greedy, head, target_params, target_config)
    xs, qs = [tok], [q]
    for j in range(1, gamma):  # unrolled, as in draft_propose: a loop-carried pool can get layout copies
        pos = (inputs.positions + j)[:, None]
        fh, draft_pool = draft_hidden(draft_params, draft_config, target_embed(target_params, target_config, tok),
                                      fh, pos[:, 0], draft_pool, multi_token_meta(inputs, pos, block_size),
                                      attention_impl)
        tok, q = _draw(fh, u[:, j, :-1], inputs, all_greedy, head, target_params, target_config)
        xs.append(tok)
        qs.append(q)
    x, q = jnp.stack(xs, axis=1), jnp.stack(qs, axis=1)

    logits, hid, target_pool = verify_with_hidden(target_params, target_config, target_pool, inputs, x,
                                                  attention_impl, layout)
    r = accept_and_advance(inputs, x, q, logits, u, target_pool, draft_pool)

    # the emitted tokens (n accepted drafts, then the new last token) at L+1 .. L+γ from the verify's true features
    # f_L .. f_{L+γ-1}: the accepted drafts' K/V again, and the next round's first draft step
    n, rows = r.num_accepted, jnp.arange(b)
    emitted = jnp.where(r.tokens[:, :gamma] >= 0, r.tokens[:, :gamma], 0)  # (PAD past the emitted: any token)
    pos = inputs.positions[:, None] + 1 + jnp.arange(gamma)[None, :]
    fix, draft_pool = draft_hidden(draft_params, draft_config, target_embed(target_params, target_config, emitted)
                                   .reshape(b * gamma, -1), hid[:, :gamma].reshape(b * gamma, -1), pos.reshape(-1),
                                   draft_pool, multi_token_meta(inputs, pos, block_size), attention_impl)
    true_next = hid[rows, n]
    now_drafted = n < gamma
    nxt = jnp.where(now_drafted[:, None], fix.reshape(b, gamma, -1)[rows, jnp.minimum(n, gamma - 1)], true_next)
    act = inputs.active[:, None]
    hidden = jnp.stack([jnp.where(act, true_next, features), jnp.where(act, nxt, features)], axis=1)
    return r.replace(draft_pool=draft_pool, hidden=hidden, drafted=jnp.where(inputs.active, now_drafted, drafted))


def fill_features(hidden: jax.Array, entry_features: jax.Array, cu_q_lens: jax.Array) -> jax.Array:
    """Each packed token's draft feature f32[T, E]: the target's hidden [T, E] at the token before it in its entry,
    or for an entry's first token its carried feature entry_features [R, E] (entries delimited by cu_q_lens
    i32[R+1]; tokens past the last entry read zeros)."""
    t = hidden.shape[0]
    idx = jnp.arange(t)
    entry = jnp.searchsorted(cu_q_lens, idx, side="right") - 1  # the entry each token belongs to
    first = idx == cu_q_lens[jnp.clip(entry, 0, cu_q_lens.shape[0] - 1)]
    carried = entry_features[jnp.clip(entry, 0, entry_features.shape[0] - 1)]
    prev = jnp.concatenate([jnp.zeros_like(hidden[:1]), hidden[:-1]]).astype(jnp.float32)
    out = jnp.where(first[:, None], carried.astype(jnp.float32), prev)
    return jnp.where((entry < entry_features.shape[0])[:, None], out, 0.0)


def draft_fill(draft_params: dict, draft_config: ModelConfig, target_params: dict, target_config: ModelConfig,
               tokens: jax.Array, positions: jax.Array, hidden: jax.Array, entry_features: jax.Array,
               draft_pool: KVPool, meta: AttentionMetadata, attention_impl: str) -> KVPool:
    """The draft over a fill's packed tokens i32[T] (``fill_features``): its pool with their K/V written."""
    feats = fill_features(hidden, entry_features, meta.cu_q_lens)
    _, draft_pool = draft_hidden(draft_params, draft_config, target_embed(target_params, target_config, tokens),
                                 feats, positions, draft_pool, meta, attention_impl)
    return draft_pool
