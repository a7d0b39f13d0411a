"""One speculative round, draft -> verify -> accept, as a pure function of explicit state.

Axis names: B sequences, G draft tokens per round (γ), V vocabulary, M pages per sequence.

``spec_round`` is the unit both ``speculative_generate`` (inside its ``lax.while_loop``) and an
engine step (one round per step under continuous batching) call. Its state is entirely in its
arguments: the two params pytrees, the two paged pools, and ``RoundInputs`` (block tables,
positions, the last two tokens, the active mask and per-row sampling settings). It returns new
pools and the next positions and tokens; it never reads the host.

Cache invariant, per row, with L = ``positions`` (the position of ``last_tokens``):
- the target pool holds K/V for positions [0, L); ``last_tokens`` is not cached yet;
- the draft pool holds K/V for [0, L-1) at least: after a round in which all γ drafts were
  accepted, the draft never saw the last draft token. Each round therefore starts with a
  two-token draft step over (``prev_tokens``, ``last_tokens``) at (L-1, L) that fills the gap
  (rewriting L-1 with the same K/V when there was none).
Rollback is just positions: K/V written for rejected drafts lie at or past the new L and are
overwritten by later rounds before anything attends to them. The block tables must cover
positions up to L + γ (lookahead pre-allocated by the caller).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.models.attention import AttentionMetadata
from jaxserve.models.transformer import forward
from jaxserve.parallel.layout import Layout
from jaxserve.sampling import SamplingBatch, argmax_first, token_logprobs
from jaxserve.speculative.draft_vocab import DraftHead, full_logits, head_logits
from jaxserve.speculative.hidden import forward_with_hidden
from jaxserve.speculative.rejection import PAD_TOKEN, draw, greedy_accept, probs_from_logits, rejection_sample, round_uniforms


@struct.dataclass
class RoundInputs:
    block_tables: jax.Array  # i32[B, M]: pages of both pools (the draft pool uses the same table)
    positions: jax.Array  # i32[B]: L, the position of last_tokens
    prev_tokens: jax.Array  # i32[B]: the token at L-1
    last_tokens: jax.Array  # i32[B]: the token at L (not in either cache)
    active: jax.Array  # bool[B]: inactive rows write nothing and keep their state
    sampling: SamplingBatch  # per-row temperature, top_k, top_p, seed, index (position unused)


@struct.dataclass
class RoundOutputs:
    tokens: jax.Array  # i32[B, G+1]: tokens[:, :num_accepted+1] are emitted, later slots PAD_TOKEN
    num_accepted: jax.Array  # i32[B]: accepted draft tokens (0 for inactive rows)
    # f32[B, G+1]: each emitted token's log-probability under the target's raw logits at its position (what
    # ``jaxserve.sampling.sample`` reports without speculation); 0 past the emitted slots. Programs that
    # never read it (``speculative_generate``) do not compute it: XLA drops the dead value.
    logprobs: jax.Array
    next: RoundInputs  # inputs for the next round (positions advanced by num_accepted + 1)
    target_pool: KVPool
    draft_pool: KVPool | None  # the draft model's pool; None for proposers without one
    hidden: jax.Array | None = None  # Medusa: the next round's target hidden f32[B, E]; EAGLE: f32[B, 2, E]; else None
    drafted: jax.Array | None = None  # EAGLE: bool[B], rows whose next round starts from the draft's own f̂
    # f32[B, G+1, V]: the verify pass's raw logits, for ``emitted_logprobs`` under a caller's condition (the engine
    # computes log-probs only when a request asks: a log-sum-exp over every verified position's vocabulary)
    target_logits: jax.Array | None = None


def slots_for(block_tables: jax.Array, positions: jax.Array, block_size: int, active: jax.Array) -> jax.Array:
    """Flat pool slots i32[B*n] for positions i32[B, n]; -1 (dropped) for inactive rows."""
    pages = jnp.take_along_axis(block_tables, positions // block_size, axis=1)
    slots = pages * block_size + positions % block_size
    return jnp.where(active[:, None], slots, -1).reshape(-1)


def multi_token_meta(inputs: RoundInputs, positions: jax.Array, block_size: int) -> AttentionMetadata:
    """Metadata for n new tokens per row at positions i32[B, n] (contiguous, ending at context-1)."""
    b, n = positions.shape
    return AttentionMetadata(slot_mapping=slots_for(inputs.block_tables, positions, block_size, inputs.active),
                             block_tables=inputs.block_tables, context_lens=positions[:, -1] + 1,
                             cu_q_lens=jnp.arange(b + 1, dtype=jnp.int32) * n, decode_only=n == 1,
                             uniform_q_len=None if n == 1 else n)


def row_probs(logits: jax.Array, s: SamplingBatch) -> jax.Array:
    """logits f32[B, ..., V] -> sampling distributions, each row's settings broadcast over the middle axes."""
    shape = logits.shape
    reps = shape[1:-1]

    def per_row(x):
        return jnp.broadcast_to(x.reshape(-1, *([1] * len(reps))), shape[:-1]).reshape(-1)

    flat = probs_from_logits(logits.reshape(-1, shape[-1]), per_row(s.temperature), per_row(s.top_k),
                             per_row(s.top_p))
    return flat.reshape(shape)


def _draft_draw(out: jax.Array, uniforms: jax.Array, s: SamplingBatch, all_greedy: jax.Array,
                head: DraftHead | None, params: dict, config: ModelConfig):
    """One draft token i32[B] and the distribution f32[B, V] it was drawn from (zeros when every row
    is greedy: then only the argmax is needed, and the acceptance reads no distributions). ``out`` is the
    draft's logits f32[B, V], or with ``head`` its final hidden state [B, E]: greedy rounds take the argmax
    over the head's tokens, sampled ones draw from the whole vocabulary (``jaxserve.speculative.draft_vocab``)."""
    vocab = uniforms.shape[-1]

    def greedy():
        x = argmax_first(out) if head is None else head.token_ids[argmax_first(head_logits(head, out, config))]
        return x, jnp.zeros((out.shape[0], vocab), jnp.float32)

    def sampled():
        q = row_probs(out if head is None else full_logits(params, config, out), s)
        return draw(q, uniforms, jnp.bool_(False)), q
    return jax.lax.cond(all_greedy, greedy, sampled)


def _draft_forward(params, config, head: DraftHead | None, tokens, positions, pool, meta, attention_impl,
                   logits_indices=None):
    """The draft's logits f32[B, V] (with ``head``: its final hidden state [B, E]) and its pool."""
    if head is None:
        return forward(params, config, tokens, positions, pool, meta, attention_impl=attention_impl,
                       logits_indices=logits_indices)
    # the logits computed here are never read (each branch of _draft_draw makes its own): XLA drops them
    _, hidden, pool = forward_with_hidden(params, config, tokens, positions, pool, meta,
                                          attention_impl=attention_impl, logits_indices=logits_indices)
    return hidden, pool


def draft_propose(params: dict, config: ModelConfig, pool: KVPool, inputs: RoundInputs, uniforms: jax.Array,
                  attention_impl: str, head: DraftHead | None = None) -> tuple[jax.Array, jax.Array, KVPool]:
    """γ draft tokens i32[B, G] and their distributions f32[B, G, V] (zeros when every row is greedy), one
    draw per uniforms[:, j] f32[B, G, V]. ``head``: in greedy rounds the draft proposes only its tokens
    (``jaxserve.speculative.draft_vocab``).

    The draft pool gains K/V for positions L-1 .. L+G-2.
    """
    block_size = pool.page_size
    b = inputs.positions.shape[0]
    pos = jnp.stack([inputs.positions - 1, inputs.positions], axis=1)
    toks = jnp.stack([inputs.prev_tokens, inputs.last_tokens], axis=1)
    out, pool = _draft_forward(params, config, head, toks.reshape(-1), pos.reshape(-1), pool,
                               multi_token_meta(inputs, pos, block_size), attention_impl,
                               logits_indices=jnp.arange(b) * 2 + 1)
    all_greedy = jnp.all(inputs.sampling.temperature <= 0)
    x, q = _draft_draw(out, uniforms[:, 0], inputs.sampling, all_greedy, head, params, config)

    # The γ-1 single-token steps are unrolled, not a lax.scan: a loop-carried pool can get layout
    # copies at the loop boundary (in the engine, with a draft of one KV head, XLA:CPU copied every
    # layer's whole pool per step: ~4 ms of a ~12 ms round), and the draft is small enough to inline.
    tokens, probs = [x], [q]
    for j in range(1, uniforms.shape[1]):
        pos = (inputs.positions + j)[:, None]
        out, pool = _draft_forward(params, config, head, tokens[-1], pos[:, 0], pool,
                                   multi_token_meta(inputs, pos, block_size), attention_impl)
        x, q = _draft_draw(out, uniforms[:, j], inputs.sampling, all_greedy, head, params, config)
        tokens.append(x)
        probs.append(q)
    return jnp.stack(tokens, axis=1), jnp.stack(probs, axis=1), pool


def target_verify(params: dict, config: ModelConfig, pool: KVPool, inputs: RoundInputs, draft_tokens: jax.Array,
                  attention_impl: str, layout: Layout | None = None) -> tuple[jax.Array, KVPool]:
    """One target pass over [last, x_1..x_G] at L..L+G -> raw logits f32[B, G+1, V] (``accept_and_advance``
    turns them into distributions only when some row samples). ``layout``: the target's device mesh."""
    block_size = pool.page_size
    b, g = draft_tokens.shape
    toks = jnp.concatenate([inputs.last_tokens[:, None], draft_tokens], axis=1)
    pos = inputs.positions[:, None] + jnp.arange(g + 1)[None, :]
    logits, pool = forward(params, config, toks.reshape(-1), pos.reshape(-1), pool,
                           multi_token_meta(inputs, pos, block_size), attention_impl=attention_impl, layout=layout)
    return logits.reshape(b, g + 1, -1), pool


def verify_with_hidden(params: dict, config: ModelConfig, pool: KVPool, inputs: RoundInputs, draft_tokens: jax.Array,
                       attention_impl: str, layout: Layout | None = None) -> tuple[jax.Array, jax.Array, KVPool]:
    """``target_verify`` that also returns the target's hidden [B, G+1, E] at L..L+G (what Medusa heads and an
    EAGLE draft read next)."""
    b, g = draft_tokens.shape
    toks = jnp.concatenate([inputs.last_tokens[:, None], draft_tokens], axis=1)
    pos = inputs.positions[:, None] + jnp.arange(g + 1)[None, :]
    logits, hidden, pool = forward_with_hidden(params, config, toks.reshape(-1), pos.reshape(-1), pool,
                                               multi_token_meta(inputs, pos, pool.page_size),
                                               attention_impl=attention_impl, layout=layout)
    return logits.reshape(b, g + 1, -1), hidden.reshape(b, g + 1, -1), pool


def spec_round(target_params: dict, draft_params: dict, target_pool: KVPool, draft_pool: KVPool,
               inputs: RoundInputs, *, target_config: ModelConfig, draft_config: ModelConfig, gamma: int,
               attention_impl: str = "auto", draft_head: DraftHead | None = None,
               layout: Layout | None = None) -> RoundOutputs:
    """Draft γ tokens, verify them in one target pass, accept exactly, advance the state.

    All of a row's randomness in the round comes from ``row_keys(seed, index, L + 1)``, so its
    tokens do not depend on what else shares the batch. See the module docstring for the cache
    invariant. ``draft_head``: the draft proposes only its tokens (``jaxserve.speculative.draft_vocab``).
    ``layout``: the target's device mesh (the draft runs replicated on it).
    """
    s = inputs.sampling
    u = round_uniforms(s.seed, s.index, inputs.positions + 1, gamma, target_config.vocab_size,
                       jnp.all(s.temperature <= 0))
    x, q, draft_pool = draft_propose(draft_params, draft_config, draft_pool, inputs, u[:, :gamma, :-1],
                                     attention_impl, draft_head)
    logits, target_pool = target_verify(target_params, target_config, target_pool, inputs, x, attention_impl, layout)
    return accept_and_advance(inputs, x, q, logits, u, target_pool, draft_pool)


def accept_and_advance(inputs: RoundInputs, x: jax.Array, q: jax.Array | None, target_logits: jax.Array,
                       u: jax.Array, target_pool: KVPool, draft_pool: KVPool | None,
                       num_drafts: jax.Array | None = None) -> RoundOutputs:
    """Rejection-samples proposals x i32[B, G] against the target's logits f32[B, G+1, V], and advances
    active rows. q f32[B, G, V]: the distributions x was drawn from; None for deterministic proposals
    (n-gram, Medusa's top-1 chain: q is the one-hot of x). When every row is greedy the acceptance is
    ``greedy_accept`` on the logits: no distributions are built (q may then be anything).
    ``num_drafts`` i32[B] in [0, G] (deterministic proposals only; None: G): row b proposed only
    x[b, :num_drafts[b]]; the rest is padding, never accepted (see ``rejection_sample``'s ``valid``)."""
    s = inputs.sampling
    greedy = s.temperature <= 0
    valid = None if num_drafts is None else jnp.arange(x.shape[1])[None, :] < num_drafts[:, None]

    def exact():
        dq = jax.nn.one_hot(x, target_logits.shape[-1], dtype=jnp.float32) if q is None else q
        if valid is not None:
            dq = jnp.where(valid[..., None], dq, 0.0)
        return rejection_sample(x, dq, row_probs(target_logits, s), u, greedy, valid)

    def greedy_only():  # PAD_TOKEN is never the argmax: a padded draft is rejected
        return greedy_accept(x if valid is None else jnp.where(valid, x, PAD_TOKEN), target_logits)
    tokens, n = jax.lax.cond(jnp.all(greedy), greedy_only, exact)
    n = jnp.where(inputs.active, n, 0)
    rows = jnp.arange(n.shape[0])
    prev = jnp.where(n == 0, inputs.last_tokens, x[rows, jnp.maximum(n - 1, 0)])
    act = inputs.active
    nxt = inputs.replace(positions=jnp.where(act, inputs.positions + n + 1, inputs.positions),
                         prev_tokens=jnp.where(act, prev, inputs.prev_tokens),
                         last_tokens=jnp.where(act, tokens[rows, n], inputs.last_tokens))
    return RoundOutputs(tokens=tokens, num_accepted=n, logprobs=emitted_logprobs(target_logits, tokens), next=nxt,
                        target_pool=target_pool, draft_pool=draft_pool, target_logits=target_logits)


def emitted_logprobs(target_logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Each emitted token's log-probability f32[B, G+1] under the verify's raw logits f32[B, G+1, V]; 0 past the
    emitted slots (``PAD_TOKEN``)."""
    b, g1, vocab = target_logits.shape
    emitted = tokens != PAD_TOKEN
    lps = token_logprobs(target_logits.reshape(b * g1, vocab), jnp.where(emitted, tokens, 0).reshape(-1))
    return jnp.where(emitted, lps.reshape(b, g1), 0.0)
