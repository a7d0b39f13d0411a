"""The runner's jitted step programs: plain step, multi-step decode, speculative fill, speculative round, the
draft's catch-up (a draft model's, an EAGLE draft's), block copy.

Axis names: T packed tokens, B sequences, R sample rows, G draft tokens (γ), V vocabulary, E hidden size.

Each is a pure function of explicit state, jitted at module level with its configuration static,
so every runner over the same configuration shares its compiled programs; the KV pools are
donated, so each layer's pages are updated in place. ``quant`` (static: a quantized params tree
looks the same under every matmul setting) selects the matmul of quantized weights.
``TRACES[0]`` counts traces, one per compiled program.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jaxserve.cache.kv_pool import KVPool
from jaxserve.engine.batching import NUM_TOP_LOGPROBS
from jaxserve.kernels.cpu.packed import PackedBf16, packed_argmax
from jaxserve.layers import packed_logits
from jaxserve.models.transformer import forward
from jaxserve.quant import matmul_context
from jaxserve.sampling import logprobs_if, sample, token_logprobs
from jaxserve.speculative.eagle import draft_hidden, target_embed
from jaxserve.speculative.hidden import forward_with_hidden
from jaxserve.speculative.eagle_round import draft_fill, eagle_round
from jaxserve.speculative.medusa import medusa_round
from jaxserve.speculative.ngram import ngram_round
from jaxserve.speculative.rejection import sample_tokens
from jaxserve.speculative.round import RoundInputs, emitted_logprobs, spec_round
from jaxserve.speculative.given_round import suffix_round

TRACES = [0]  # incremented while tracing: one per compiled program


@functools.partial(jax.jit, static_argnames=("config", "attention_impl", "quant", "layout"),
                   donate_argnames=("kv_pool",))
def plain_step(params, kv_pool: KVPool, tokens, positions, meta, logits_indices, sample_entry, sbatch, want_top,
               want_logprobs, router_state=None, *, config, attention_impl, quant=None, layout=None):
    """One forward over the packed tokens, then a draw per sample row: tokens i32[R], their log-probs
    f32[R] (when ``want_logprobs``, else NaN), and (when ``want_top``, else zeros) the top candidates' log-probs
    f32[R, k] and ids i32[R, k].
    ``layout`` (a ``jaxserve.parallel.layout.Layout``): the mesh params and pool live on; the pool
    stays sharded as it came in, and the results come back replicated."""
    TRACES[0] += 1
    return _plain(params, kv_pool, tokens, positions, meta, logits_indices, sample_entry, sbatch, want_top,
                  want_logprobs, router_state, config=config, attention_impl=attention_impl, quant=quant, layout=layout)


@functools.partial(jax.jit, static_argnames=("config", "attention_impl", "quant", "layout"),
                   donate_argnames=("kv_pool",))
def multi_step(params, kv_pool: KVPool, tokens, positions, slots, context, meta, logits_indices, sample_entry, sbatch,
               want_logprobs, router_state=None, *, config, attention_impl, quant=None, layout=None):
    """K decode steps (K = ``positions.shape[0]``) of B sequences, unrolled in one program (a ``lax.fori_loop``
    carrying the pool compiled once but ran slower than K separate calls on XLA:CPU: SmolLM2 bf16 at batch 1,
    13.1 against 11.2 ms a step), each step's drawn tokens the next step's inputs: tokens i32[K, R] and their
    log-probs f32[K, R] (NaN unless ``want_logprobs``). Step k runs each row at ``positions[k]`` i32[B], writes
    its K/V to ``slots[k]`` i32[B] (-1: nowhere) and attends to ``context[k]`` i32[B] positions; ``meta`` is
    step 0's decode metadata (its tables cover every step) and ``sbatch`` step 0's draws, later steps drawing at
    ``context[k]`` (the draw's key is (seed, index, position): K single steps draw the same bits). Rows map one
    to one onto sequences: R == B."""
    TRACES[0] += 1
    no_top = jnp.bool_(False)
    steps = []
    for k in range(positions.shape[0]):
        meta_k = meta.replace(slot_mapping=slots[k], context_lens=context[k])
        sbatch_k = sbatch.replace(position=context[k][sample_entry])
        (toks, lps, _, _), kv_pool = _plain(params, kv_pool, tokens, positions[k], meta_k, logits_indices,
                                            sample_entry, sbatch_k, no_top, want_logprobs, router_state, config=config,
                                            attention_impl=attention_impl, quant=quant, layout=layout)
        steps.append((toks, lps))
        tokens = toks
    toks, lps = (jnp.stack(x) for x in zip(*steps))
    return (toks, lps), kv_pool


def _plain(params, kv_pool: KVPool, tokens, positions, meta, logits_indices, sample_entry, sbatch, want_top,
           want_logprobs, router_state, *, config, attention_impl, quant, layout):
    """``plain_step``'s body (``multi_step`` runs it K times)."""
    head = greedy_head(params, config, layout) if quant is None else None
    with matmul_context(quant):
        out, kv_pool = forward(params, config, tokens, positions, kv_pool, meta,
                               attention_impl=attention_impl, logits_indices=logits_indices,
                               router_state=router_state, layout=layout, hidden_only=head is not None)
    if head is None:
        if layout is not None:
            kv_pool, out = layout.constrain_pool(kv_pool), layout.replicate(out)
        results = _sample_rows(out, sample_entry, sbatch, want_top, want_logprobs)
        return (results if layout is None else layout.replicate(results)), kv_pool
    r, k = sample_entry.shape[0], min(NUM_TOP_LOGPROBS, config.vocab_size)
    results = _head_samples(out, head, config, sample_entry, sbatch, want_logprobs | want_top,
                            lambda logits: _sample_rows(logits, sample_entry, sbatch, want_top, want_logprobs),
                            (jnp.full((r,), jnp.nan, jnp.float32), jnp.zeros((r, k), jnp.float32),
                             jnp.zeros((r, k), jnp.int32)))
    return results, kv_pool


def greedy_head(params, config, layout):
    """The packed tied LM head (``kernels.cpu.packed.pack_tied_head``) a plain step can take greedy tokens from
    (``packed_argmax``): a bf16 model with its tied head packed, on one device, no int8 head, no logit soft-cap;
    else None. Decided by the params' structure: static under jit."""
    head = params.get("tied_head", {}).get("kernel") if isinstance(params, Mapping) else None
    ok = (isinstance(head, PackedBf16) and config.tie_word_embeddings and "int8_head" not in params
          and config.final_logit_softcap is None and layout is None and jnp.dtype(config.dtype) == jnp.bfloat16)
    return head if ok else None


def _sample_rows(logits, sample_entry, sbatch, want_top, want_logprobs):
    """A draw per sample row from logits f32[B, V]: (tokens i32[R], their log-probs f32[R] (NaN unless
    ``want_logprobs``), the top candidates' log-probs f32[R, k] and ids i32[R, k] (zeros unless ``want_top``))."""
    toks, logprobs = sample(logits, sbatch, want_logprobs, rows=sample_entry)
    k, r = min(NUM_TOP_LOGPROBS, logits.shape[-1]), sample_entry.shape[0]
    # a runtime branch, not a static flag (which would double the programs): only beam search
    # asks, and at batch 64 x 4096 the top-k costs ~1 ms of a ~20 ms CPU decode step
    top_logprobs, top_ids = jax.lax.cond(
        want_top, lambda: tuple(jax.lax.top_k(jax.nn.log_softmax(logits[sample_entry], axis=-1), k)),
        lambda: (jnp.zeros((r, k), jnp.float32), jnp.zeros((r, k), jnp.int32)))
    return toks, logprobs, top_logprobs, top_ids


def _head_samples(out, head, config, sample_entry, sbatch, extras_wanted, from_logits, placeholders: tuple):
    """A step's draws from its final hidden states ``out`` f32[R', E] through the packed tied ``head``
    (``greedy_head``). A step whose rows are all greedy and want nothing more (``extras_wanted``, a traced bool:
    log-probs, top candidates) takes its tokens from the head's GEMM (``packed_argmax``: the first column of each
    row's largest bf16 logit, as the argmax of the logits gives it) without writing the [R', V] logits, beside the
    ``placeholders`` of the other results; any other step returns ``from_logits`` of the logits f32[R', V] as
    forward would compute them. Both branches return (tokens i32[R], *placeholders' structure)."""
    hidden = out.astype(config.dtype)  # (the final norm's output, exactly)
    fast = jnp.all(sbatch.temperature <= 0) & jnp.logical_not(extras_wanted)
    return jax.lax.cond(fast, lambda: (packed_argmax(hidden, head)[sample_entry], *placeholders),
                        lambda: from_logits(packed_logits(head, hidden, config.dtype).astype(jnp.float32)))


def _fill_samples(out, head, config, sample_entry, sbatch, want_logprobs):
    """A fill step's draws per sample row: tokens i32[R] drawn as rounds draw (``sample_tokens``) and their
    log-probs f32[R] (NaN unless ``want_logprobs``). ``out`` holds the logits f32[R', V], or with a packed greedy
    ``head`` the hidden states (``_head_samples``, as ``plain_step``)."""
    def from_logits(logits):
        logits = logits[sample_entry]
        toks = sample_tokens(logits, sbatch)
        return toks, logprobs_if(want_logprobs, lambda: token_logprobs(logits, toks), toks.shape)
    if head is None:
        return from_logits(out)
    return _head_samples(out, head, config, sample_entry, sbatch, want_logprobs, from_logits,
                         (jnp.full(sample_entry.shape, jnp.nan, jnp.float32),))


SPECULATIVE_STATIC = ("target_config", "proposer_config", "method", "attention_impl", "quant", "layout")


@functools.partial(jax.jit, static_argnames=SPECULATIVE_STATIC + ("draft_pass",),
                   donate_argnames=("target_pool", "draft_pool"))
def fill_step(target_params, proposer_params, target_pool: KVPool, draft_pool: KVPool | None, tokens, positions,
              meta, last, sample_entry, sbatch, want_logprobs, entry_features=None, *, target_config, proposer_config,
              method: str, attention_impl: str, quant=None, layout=None, draft_pass: bool = True):
    """Target pass (+ its hidden for Medusa and EAGLE) and, with ``draft_pass``, the draft's pass over the same
    packed tokens, so the draft's pool covers what the target's does (a plain decode step skips it: ``draft_catch_up``
    runs it before the sequence's next round, an EAGLE draft from the features the runner kept); samples rows and returns their tokens' log-probabilities
    under the raw logits (NaN unless ``want_logprobs``, a traced bool, as in ``plain_step``), and the target's
    hidden f32[R', E] at each entry's last token (Medusa, EAGLE; else zeros). ``entry_features`` f32[R', E]
    (EAGLE): the hidden before each entry's first token (``jaxserve.speculative.eagle_round.fill_features``).
    Float proposer weights are untouched by ``quant``.
    ``layout``: the target's mesh, as in ``plain_step``; the proposer runs replicated on it."""
    TRACES[0] += 1
    head = greedy_head(target_params, target_config, layout) if quant is None else None
    hidden_only = head is not None  # the head applied below, greedy steps by packed_argmax
    with matmul_context(quant):
        if method == "eagle" and draft_pass:
            out, hidden_all, target_pool = forward_with_hidden(
                target_params, target_config, tokens, positions, target_pool, meta, attention_impl=attention_impl,
                logits_indices=last, layout=layout, all_hidden=True, hidden_only=hidden_only)
            draft_pool = draft_fill(proposer_params, proposer_config, target_params, target_config, tokens, positions,
                                    hidden_all, entry_features, draft_pool, meta, attention_impl)
            hidden = hidden_all[last].astype(jnp.float32)
        elif method in ("medusa", "eagle"):
            out, hidden, target_pool = forward_with_hidden(target_params, target_config, tokens, positions,
                                                           target_pool, meta, attention_impl=attention_impl,
                                                           logits_indices=last, layout=layout, hidden_only=hidden_only)
            hidden = hidden.astype(jnp.float32)
        else:
            out, target_pool = forward(target_params, target_config, tokens, positions, target_pool, meta,
                                       attention_impl=attention_impl, logits_indices=last, layout=layout,
                                       hidden_only=hidden_only)
            hidden = jnp.zeros((last.shape[0], 1), jnp.float32)
        if method == "draft_model" and draft_pass:
            _, draft_pool = forward(proposer_params, proposer_config, tokens, positions, draft_pool, meta,
                                    attention_impl=attention_impl, logits_indices=last)
        toks, logprobs = _fill_samples(out, head, target_config, sample_entry, sbatch, want_logprobs)
        return _on_mesh(layout, (toks, logprobs, hidden), target_pool, draft_pool)


@functools.partial(jax.jit, static_argnames=SPECULATIVE_STATIC + ("gamma", "max_ngram", "min_ngram", "first_step"),
                   donate_argnames=("target_pool", "draft_pool"))
def round_step(target_params, proposer_params, target_pool: KVPool, draft_pool: KVPool | None, inputs: RoundInputs,
               extra, want_logprobs, *, target_config, proposer_config, method: str, attention_impl: str, gamma: int,
               max_ngram: int, min_ngram: int, quant=None, layout=None, first_step: bool = True):
    """One round for every row: (tokens i32[B, G+1], accepted i32[B], log-probs f32[B, G+1] (NaN unless
    ``want_logprobs``, a traced bool), Medusa's next hidden f32[B, E] or EAGLE's f32[B, 2, E] (else a 0-d zero),
    pools). ``extra`` is the n-gram history i32[B, H], the Medusa hidden f32[B, E], the draft's restricted head (a
    ``DraftHead`` or None), EAGLE's (``DraftHead``, each row's features f32[B, E], drafted bool[B]:
    ``eagle_round``'s), or suffix decoding's host drafts i32[B, W] (W <= G: the round's width) and their lengths
    i32[B]. ``first_step`` (EAGLE): False when every active row is drafted (its first draft step is skipped)."""
    TRACES[0] += 1
    with matmul_context(quant):
        if method == "draft_model":
            r = spec_round(target_params, proposer_params, target_pool, draft_pool, inputs, target_config=target_config,
                           draft_config=proposer_config, gamma=gamma, attention_impl=attention_impl, draft_head=extra,
                           layout=layout)
            draft_pool = r.draft_pool
        elif method == "ngram":
            r = ngram_round(target_params, target_pool, inputs, extra, target_config=target_config, gamma=gamma,
                            max_ngram=max_ngram, min_ngram=min_ngram, attention_impl=attention_impl, layout=layout)
        elif method == "eagle":
            r = eagle_round(target_params, proposer_params, target_pool, draft_pool, inputs, extra[1], extra[2],
                            target_config=target_config, draft_config=proposer_config, head=extra[0], gamma=gamma,
                            attention_impl=attention_impl, layout=layout, first_step=first_step)
            draft_pool = r.draft_pool
        elif method == "suffix":
            r = suffix_round(target_params, target_pool, inputs, *extra, target_config=target_config, max_gamma=gamma,
                             attention_impl=attention_impl, layout=layout)
        else:
            r = medusa_round(target_params, proposer_params, target_pool, inputs, extra, target_config=target_config,
                             heads_config=proposer_config, gamma=gamma, attention_impl=attention_impl, layout=layout)
        hidden = r.hidden if r.hidden is not None else jnp.zeros((), jnp.float32)
        # (r.logprobs, computed whether asked or not, is left unread: XLA drops it)
        logprobs = logprobs_if(want_logprobs, lambda: emitted_logprobs(r.target_logits, r.tokens), r.tokens.shape)
        return _on_mesh(layout, (r.tokens, r.num_accepted, logprobs, hidden), r.target_pool, draft_pool)


@functools.partial(jax.jit, static_argnames=("method", "proposer_config", "target_config", "attention_impl", "layout"),
                   donate_argnames=("draft_pool",))
def draft_catch_up(proposer_params, target_params, draft_pool: KVPool, tokens, positions, meta, features=None, *,
                   method: str, proposer_config, target_config, attention_impl: str, layout=None) -> KVPool:
    """The draft alone over packed tokens i32[T] (the positions plain decode steps did not run it over): its pool, as
    the skipped fills would have left it. A draft model reads the tokens only (its logits are never read: XLA drops
    the head; one row is asked for in case it did not); an EAGLE draft (``method``) also each token's feature
    f32[T, E], the target's hidden before it, which the runner kept from those steps."""
    TRACES[0] += 1
    if method == "eagle":
        _, draft_pool = draft_hidden(proposer_params, proposer_config,
                                     target_embed(target_params, target_config, tokens), features, positions,
                                     draft_pool, meta, attention_impl)
    else:
        _, draft_pool = forward(proposer_params, proposer_config, tokens, positions, draft_pool, meta,
                                attention_impl=attention_impl, logits_indices=jnp.zeros(1, jnp.int32))
    return draft_pool if layout is None else layout.replicate(draft_pool)


def _on_mesh(layout, results: tuple, target_pool: KVPool, draft_pool: KVPool | None) -> tuple:
    """(*results, target_pool, draft_pool); on a mesh the results replicated, the target pool sharded as it came
    in and the draft's pool replicated."""
    if layout is None:
        return *results, target_pool, draft_pool
    return (*layout.replicate(results), layout.constrain_pool(target_pool),
            None if draft_pool is None else layout.replicate(draft_pool))


@functools.partial(jax.jit, donate_argnames=("pool",))
def copy_step(pool: KVPool, src, dst) -> KVPool:
    TRACES[0] += 1
    return pool.copy_blocks(src, dst)
