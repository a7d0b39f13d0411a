"""Batched generation with speculative decoding, and the target-only baseline, each one jitted program.

Axis names: B sequences, Lp padded prompt length, N output capacity, G draft tokens (γ), M pages
per sequence.

``speculative_generate`` prefills both models, then runs ONE ``lax.while_loop`` whose body is
``spec_round`` (draft γ tokens with an inner ``scan``, verify in one target pass, exact rejection
sampling, roll back by positions) plus EOS / max_tokens bookkeeping; the loop ends when every
sequence is done. ``target_only_generate`` is the same program with a plain decode step as the
body; ``ngram_generate`` and ``medusa_generate`` swap the draft for prompt lookup or Medusa heads.
Nothing returns to the host until the batch is finished. ``suffix_generate`` is the exception: its
suffix trees live on the host, so it runs one jitted round per host iteration (see its docstring).

Shapes are bucketed (powers of two for B, Lp and N), so one program serves every call in a
(batch, prompt, output, γ) bucket; per-request lengths, max_tokens, sampling settings, seeds and
EOS are arrays. Each sequence's pages are pre-allocated contiguously with γ+1 lookahead slots.
``TRACES`` counts traces (each one compile) per program.
"""
from __future__ import annotations

import itertools
from collections import Counter
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxserve.buckets import bucket, powers_of_two
from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.models.attention import AttentionMetadata
from jaxserve.models.attention_backends import new_kv_pool
from jaxserve.models.transformer import forward
from jaxserve.sampling import SamplingBatch
from jaxserve.speculative.config import check_eagle_matches, check_medusa_matches
from jaxserve.speculative.draft_vocab import DraftHead, check_draft_head
from jaxserve.speculative.hidden import forward_with_hidden
from jaxserve.speculative.eagle_round import draft_fill, eagle_round
from jaxserve.speculative.medusa import medusa_round
from jaxserve.speculative.metrics import SpecMetrics
from jaxserve.speculative.rejection import PAD_TOKEN, sample_tokens
from jaxserve.speculative.ngram import ngram_round
from jaxserve.speculative.round import RoundInputs, slots_for, spec_round
from jaxserve.speculative.given_round import suffix_round
from jaxserve.speculative.suffix_tree import SuffixCache

TRACES: Counter = Counter()  # program name -> times traced (== compiled)
_SUFFIX_CALLS = itertools.count()  # suffix_generate's request keys in a shared SuffixCache


@struct.dataclass
class LoopState:
    target_pool: KVPool
    draft_pool: KVPool | None  # the draft model's or EAGLE draft's pool (None: target-only, n-gram, Medusa)
    # Medusa: the target's hidden f32[B, E] the heads read next; EAGLE: (the features f32[B, E] its next round
    # reads, drafted bool[B]: eagle_round's); else None
    hidden: jax.Array | tuple | None
    inputs: RoundInputs
    out: jax.Array  # i32[B, N+G+1]: generated tokens (valid below num_generated)
    history: jax.Array  # i32[B, Lp+N+G+1]: the token at position t in slot t (valid up to positions)
    num_generated: jax.Array  # i32[B]
    done: jax.Array  # bool[B]
    metrics: SpecMetrics


def _prefill_meta(prompts, prompt_lens, tables, block_size):
    """Positions i32[B, Lp], the attention metadata and each prompt's last token's packed index i32[B] of a prefill.

    Rows are laid out Lp apart with context Lp; causality keeps real tokens from seeing the
    padding, whose K/V writes are dropped.
    """
    b, lp = prompts.shape
    pos = jnp.broadcast_to(jnp.arange(lp, dtype=jnp.int32), (b, lp))
    slots = slots_for(tables, pos, block_size, jnp.ones(b, bool)).reshape(b, lp)
    slots = jnp.where(pos < prompt_lens[:, None], slots, -1)
    meta = AttentionMetadata(slot_mapping=slots.reshape(-1), block_tables=tables,
                             context_lens=jnp.full(b, lp, jnp.int32), cu_q_lens=jnp.arange(b + 1, dtype=jnp.int32) * lp,
                             uniform_q_len=lp, fresh=True)
    return pos, meta, jnp.arange(b) * lp + prompt_lens - 1


def _prefill(params, config, pool, prompts, prompt_lens, tables, attention_impl, with_hidden=False,
             all_hidden=False):
    """Writes each prompt's K/V and returns the logits f32[B, V] at its last token (and its hidden [B, E], or with
    ``all_hidden`` every token's [B*Lp, E])."""
    pos, meta, last = _prefill_meta(prompts, prompt_lens, tables, pool.page_size)
    if with_hidden:
        return forward_with_hidden(params, config, prompts.reshape(-1), pos.reshape(-1), pool, meta,
                                   attention_impl=attention_impl, logits_indices=last, all_hidden=all_hidden)
    logits, pool = forward(params, config, prompts.reshape(-1), pos.reshape(-1), pool, meta,
                           attention_impl=attention_impl, logits_indices=last)
    return logits, pool


def _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real, *,
           gamma, block_size, pages_per_seq, capacity, attention_impl, with_hidden=False, all_hidden=False):
    """Prefills the target, samples the first token, and builds the loop state (draft pool empty,
    or with_hidden: the target's hidden at each prompt's last token; with all_hidden at every prompt slot)."""
    b = prompts.shape[0]
    tables = jnp.arange(b * pages_per_seq, dtype=jnp.int32).reshape(b, pages_per_seq)
    pool = new_kv_pool(target_config, b * pages_per_seq, block_size, attention_impl)
    pre = _prefill(target_params, target_config, pool, prompts, prompt_lens, tables, attention_impl, with_hidden,
                   all_hidden)
    logits, pool = pre[0], pre[-1]
    first = sample_tokens(logits, sampling.replace(position=prompt_lens))
    out = jnp.full((b, capacity + gamma + 1), PAD_TOKEN, jnp.int32).at[:, 0].set(first)
    inputs = RoundInputs(block_tables=tables, positions=prompt_lens, last_tokens=first,
                         prev_tokens=jnp.take_along_axis(prompts, (prompt_lens - 1)[:, None], axis=1)[:, 0],
                         active=real, sampling=sampling)
    metrics = SpecMetrics.zeros(b, gamma)
    metrics = metrics.replace(target_calls=real.astype(jnp.int32), generated=real.astype(jnp.int32))
    done = ~real | (first == eos) | (max_tokens <= 1)
    history = jnp.zeros((b, prompts.shape[1] + capacity + gamma + 1), jnp.int32).at[:, :prompts.shape[1]].set(prompts)
    history = history.at[jnp.arange(b), prompt_lens].set(first)
    hidden = pre[1] if with_hidden else None
    return LoopState(pool, None, hidden, inputs.replace(active=~done), out, history, jnp.ones(b, jnp.int32), done,
                     metrics)


def _commit(state: LoopState, tokens, num_accepted, nxt: RoundInputs, max_tokens, eos, target_pool,
            draft_pool=None, hidden=None, drafted=None) -> LoopState:
    """Appends each active row's emitted tokens, truncated at EOS and max_tokens, and updates done."""
    active = state.inputs.active
    g1 = tokens.shape[1]
    slot = jnp.arange(g1)[None, :]
    proposed = num_accepted + 1
    is_eos = (tokens == eos) & (slot < proposed[:, None])
    until_eos = jnp.where(is_eos.any(axis=1), jnp.argmax(is_eos, axis=1) + 1, g1 + 1)
    emitted = jnp.minimum(jnp.minimum(proposed, until_eos), max_tokens - state.num_generated)
    written = jax.vmap(lambda row, t, at: jax.lax.dynamic_update_slice(row, t, (at,)))(
        state.out, tokens, state.num_generated)
    out = jnp.where(active[:, None], written, state.out)
    recorded = jax.vmap(lambda row, t, at: jax.lax.dynamic_update_slice(row, t, (at,)))(
        state.history, tokens, state.inputs.positions + 1)
    history = jnp.where(active[:, None], recorded, state.history)
    num_generated = state.num_generated + jnp.where(active, emitted, 0)
    done = state.done | (active & ((until_eos <= emitted) | (num_generated >= max_tokens)))
    metrics = state.metrics.record_round(active, num_accepted, emitted, drafted)
    return LoopState(target_pool, draft_pool, hidden, nxt.replace(active=~done), out, history, num_generated, done,
                     metrics)


def _finish(state: LoopState, capacity: int):
    cols = jnp.arange(capacity)[None, :]
    tokens = jnp.where(cols < state.num_generated[:, None], state.out[:, :capacity], PAD_TOKEN)
    return tokens, state.num_generated, state.metrics


_STATIC = ("target_config", "draft_config", "gamma", "block_size", "pages_per_seq", "capacity", "attention_impl")


@partial(jax.jit, static_argnames=_STATIC)
def _speculative_program(target_params, draft_params, prompts, prompt_lens, max_tokens, sampling, eos, real,
                         draft_head=None, *, target_config, draft_config, gamma, block_size, pages_per_seq, capacity,
                         attention_impl):
    TRACES["speculative"] += 1  # runs only while tracing
    state = _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real,
                   gamma=gamma, block_size=block_size, pages_per_seq=pages_per_seq, capacity=capacity,
                   attention_impl=attention_impl)
    draft_pool = new_kv_pool(draft_config, state.target_pool.num_pages, block_size, attention_impl)
    _, draft_pool = _prefill(draft_params, draft_config, draft_pool, prompts, prompt_lens,
                             state.inputs.block_tables, attention_impl)

    def body(st: LoopState) -> LoopState:
        r = spec_round(target_params, draft_params, st.target_pool, st.draft_pool, st.inputs,
                       target_config=target_config, draft_config=draft_config, gamma=gamma,
                       attention_impl=attention_impl, draft_head=draft_head)
        return _commit(st, r.tokens, r.num_accepted, r.next, max_tokens, eos, r.target_pool, r.draft_pool)

    state = jax.lax.while_loop(lambda st: jnp.any(~st.done), body, state.replace(draft_pool=draft_pool))
    return _finish(state, capacity)


@partial(jax.jit, static_argnames=_STATIC)
def _target_only_program(target_params, draft_params, prompts, prompt_lens, max_tokens, sampling, eos, real, *,
                         target_config, draft_config, gamma, block_size, pages_per_seq, capacity, attention_impl):
    TRACES["target_only"] += 1
    del draft_params, draft_config, gamma
    state = _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real,
                   gamma=0, block_size=block_size, pages_per_seq=pages_per_seq, capacity=capacity,
                   attention_impl=attention_impl)

    def body(st: LoopState) -> LoopState:
        inp = st.inputs
        pos = inp.positions[:, None]
        meta = AttentionMetadata(slot_mapping=slots_for(inp.block_tables, pos, block_size, inp.active),
                                 block_tables=inp.block_tables, context_lens=inp.positions + 1,
                                 cu_q_lens=jnp.arange(pos.shape[0] + 1, dtype=jnp.int32), decode_only=True)
        logits, pool = forward(target_params, target_config, inp.last_tokens, inp.positions, st.target_pool, meta,
                               attention_impl=attention_impl)
        tok = sample_tokens(logits, inp.sampling.replace(position=inp.positions + 1))
        nxt = inp.replace(positions=inp.positions + 1, prev_tokens=inp.last_tokens, last_tokens=tok)
        return _commit(st, tok[:, None], jnp.zeros_like(tok), nxt, max_tokens, eos, pool)

    state = jax.lax.while_loop(lambda st: jnp.any(~st.done), body, state)
    return _finish(state, capacity)


@partial(jax.jit, static_argnames=_STATIC + ("max_ngram", "min_ngram"))
def _ngram_program(target_params, draft_params, prompts, prompt_lens, max_tokens, sampling, eos, real, *,
                   target_config, draft_config, gamma, block_size, pages_per_seq, capacity, attention_impl,
                   max_ngram, min_ngram):
    TRACES["ngram"] += 1
    del draft_params, draft_config
    state = _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real,
                   gamma=gamma, block_size=block_size, pages_per_seq=pages_per_seq, capacity=capacity,
                   attention_impl=attention_impl)

    def body(st: LoopState) -> LoopState:
        r = ngram_round(target_params, st.target_pool, st.inputs, st.history, target_config=target_config,
                        gamma=gamma, max_ngram=max_ngram, min_ngram=min_ngram, attention_impl=attention_impl)
        return _commit(st, r.tokens, r.num_accepted, r.next, max_tokens, eos, r.target_pool)

    state = jax.lax.while_loop(lambda st: jnp.any(~st.done), body, state)
    return _finish(state, capacity)


@partial(jax.jit, static_argnames=_STATIC + ("heads_config",))
def _medusa_program(target_params, draft_params, prompts, prompt_lens, max_tokens, sampling, eos, real, *,
                    target_config, draft_config, gamma, block_size, pages_per_seq, capacity, attention_impl,
                    heads_config):
    TRACES["medusa"] += 1
    del draft_config  # draft_params are the heads' params
    state = _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real,
                   gamma=gamma, block_size=block_size, pages_per_seq=pages_per_seq, capacity=capacity,
                   attention_impl=attention_impl, with_hidden=True)

    def body(st: LoopState) -> LoopState:
        r = medusa_round(target_params, draft_params, st.target_pool, st.inputs, st.hidden,
                         target_config=target_config, heads_config=heads_config, gamma=gamma,
                         attention_impl=attention_impl)
        return _commit(st, r.tokens, r.num_accepted, r.next, max_tokens, eos, r.target_pool, hidden=r.hidden)

    state = jax.lax.while_loop(lambda st: jnp.any(~st.done), body, state)
    return _finish(state, capacity)


@partial(jax.jit, static_argnames=_STATIC)
def _eagle_program(target_params, draft_params, prompts, prompt_lens, max_tokens, sampling, eos, real, draft_head, *,
                   target_config, draft_config, gamma, block_size, pages_per_seq, capacity, attention_impl):
    TRACES["eagle"] += 1
    state = _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real,
                   gamma=gamma, block_size=block_size, pages_per_seq=pages_per_seq, capacity=capacity,
                   attention_impl=attention_impl, with_hidden=True, all_hidden=True)
    pos, meta, last = _prefill_meta(prompts, prompt_lens, state.inputs.block_tables, block_size)
    draft_pool = new_kv_pool(draft_config, state.target_pool.num_pages, block_size, attention_impl)
    draft_pool = draft_fill(draft_params, draft_config, target_params, target_config, prompts.reshape(-1),
                            pos.reshape(-1), state.hidden, jnp.zeros((prompts.shape[0], target_config.hidden_size)),
                            draft_pool, meta, attention_impl)

    def body(st: LoopState) -> LoopState:  # (every round may hold undrafted rows: its first step always runs)
        r = eagle_round(target_params, draft_params, st.target_pool, st.draft_pool, st.inputs, *st.hidden,
                        target_config=target_config, draft_config=draft_config, head=draft_head, gamma=gamma,
                        attention_impl=attention_impl)
        return _commit(st, r.tokens, r.num_accepted, r.next, max_tokens, eos, r.target_pool, r.draft_pool,
                       (r.hidden[:, 1], r.drafted))

    b = prompts.shape[0]
    state = state.replace(draft_pool=draft_pool, hidden=(state.hidden[last].astype(jnp.float32), jnp.zeros(b, bool)))
    state = jax.lax.while_loop(lambda st: jnp.any(~st.done), body, state)
    return _finish(state, capacity)


@partial(jax.jit, static_argnames=("target_config", "gamma", "block_size", "pages_per_seq", "capacity",
                                   "attention_impl"))
def _suffix_start(target_params, prompts, prompt_lens, max_tokens, sampling, eos, real, *, target_config, gamma,
                  block_size, pages_per_seq, capacity, attention_impl) -> LoopState:
    TRACES["suffix_start"] += 1
    return _start(target_params, target_config, prompts, prompt_lens, max_tokens, sampling, eos, real, gamma=gamma,
                  block_size=block_size, pages_per_seq=pages_per_seq, capacity=capacity, attention_impl=attention_impl)


@partial(jax.jit, static_argnames=("target_config", "gamma", "attention_impl"), donate_argnames=("state",))
def _suffix_step(target_params, state: LoopState, drafts, num_drafts, max_tokens, eos, *, target_config, gamma,
                 attention_impl):
    """One round over host drafts i32[B, G] of lengths i32[B] -> (state, tokens i32[B, G+1], accepted i32[B])."""
    TRACES["suffix_round"] += 1
    r = suffix_round(target_params, state.target_pool, state.inputs, drafts, num_drafts,
                     target_config=target_config, max_gamma=gamma, attention_impl=attention_impl)
    state = _commit(state, r.tokens, r.num_accepted, r.next, max_tokens, eos, r.target_pool,
                    drafted=jnp.clip(num_drafts, 0, drafts.shape[1]))
    return state, r.tokens, r.num_accepted


def _suffix_program(target_params, draft_params, prompts, prompt_lens, max_tokens, sampling, eos, real, *,
                    target_config, draft_config, gamma, block_size, pages_per_seq, capacity, attention_impl,
                    cache: SuffixCache):
    """The host loop of ``suffix_generate``: prefill, then per round host drafts -> one jitted round."""
    del draft_params, draft_config
    state = _suffix_start(target_params, prompts, prompt_lens, max_tokens, sampling, eos, real,
                          target_config=target_config, gamma=gamma, block_size=block_size,
                          pages_per_seq=pages_per_seq, capacity=capacity, attention_impl=attention_impl)
    first, done = jax.device_get((state.inputs.last_tokens, state.done))
    call = next(_SUFFIX_CALLS)
    keys = [("suffix_generate", call, i) for i in range(prompts.shape[0])]
    for i in np.flatnonzero(real):
        cache.extend(keys[i], [*prompts[i, :prompt_lens[i]].tolist(), int(first[i])])
    drafts = np.zeros((prompts.shape[0], gamma), np.int32)
    widths = powers_of_two(1, gamma)  # a round verifies only as many slots as its longest draft (bucketed)
    while not done.all():
        num_drafts = np.zeros(prompts.shape[0], np.int32)
        for i in np.flatnonzero(~done):
            d = cache.propose(keys[i], gamma).tokens
            drafts[i, :len(d)], num_drafts[i] = d, len(d)
        width = min(bucket(max(int(num_drafts.max()), 1), widths), gamma)
        state, toks, acc = _suffix_step(target_params, state, drafts[:, :width], num_drafts, max_tokens, eos,
                                        target_config=target_config, gamma=gamma, attention_impl=attention_impl)
        live = ~done
        toks, acc, done = jax.device_get((toks, acc, state.done))
        for i in np.flatnonzero(live):
            cache.extend(keys[i], toks[i, :acc[i] + 1].tolist())
    tokens, num_generated, metrics = _finish(state, capacity)
    tokens_h, n_h = np.asarray(tokens), np.asarray(num_generated)
    for i in range(prompts.shape[0]):
        cache.finish(keys[i], tokens_h[i, :n_h[i]].tolist() if real[i] else None)
    return tokens, num_generated, metrics


def _per_row(value, b: int, dtype, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        arr = np.full(b, arr, dtype)
    if arr.shape != (b,):
        raise ValueError(f"{name} must be a scalar or have shape ({b},), got shape {arr.shape}")
    return arr


def _prepare(target_config, draft_config, prompts, prompt_lens, gamma, max_tokens, temperature, top_k, top_p,
             seeds, eos_token_id, block_size):
    """Validates on the host and pads everything to bucketed shapes; returns (arrays, static kwargs)."""
    prompts = np.asarray(prompts)
    if prompts.ndim != 2 or prompts.shape[0] == 0 or prompts.shape[1] == 0:
        raise ValueError(f"prompts must be a non-empty i32[B, Lp] array, got shape {prompts.shape}")
    b, lp = prompts.shape
    lens = _per_row(prompt_lens, b, np.int32, "prompt_lens")
    max_tokens = _per_row(max_tokens, b, np.int32, "max_tokens")
    temperature = _per_row(temperature, b, np.float32, "temperature")
    top_k = _per_row(top_k, b, np.int32, "top_k")
    top_p = _per_row(top_p, b, np.float32, "top_p")
    seeds = _per_row(seeds, b, np.uint32, "seeds")
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if lens.min() < 1 or lens.max() > lp:
        raise ValueError(f"prompt_lens must lie in [1, {lp}], got {lens.tolist()}")
    if max_tokens.min() < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens.tolist()}")
    if temperature.min() < 0 or top_k.min() < 0 or not ((top_p > 0) & (top_p <= 1)).all():
        raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {temperature.tolist()}, "
                         f"{top_k.tolist()}, {top_p.tolist()}")
    for cfg in (target_config, draft_config):
        if cfg is None:
            continue
        if cfg.vocab_size != target_config.vocab_size:
            raise ValueError(f"draft vocab_size {cfg.vocab_size} != target vocab_size {target_config.vocab_size}")
        valid = prompts[np.arange(lp)[None, :] < lens[:, None]]
        if valid.min() < 0 or valid.max() >= cfg.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {cfg.vocab_size}), got {valid.min()}..{valid.max()}")
        need = int((lens + max_tokens).max()) + gamma
        if need > cfg.max_position_embeddings:
            raise ValueError(f"prompt + max_tokens + gamma = {need} exceeds max_position_embeddings "
                             f"{cfg.max_position_embeddings}")

    bb = bucket(b, powers_of_two(1, b))
    lpb = bucket(lp, powers_of_two(8, lp))
    cap = bucket(int(max_tokens.max()), powers_of_two(8, int(max_tokens.max())))
    pad_rows = bb - b
    padded_prompts = np.zeros((bb, lpb), np.int32)
    padded_prompts[:b, :lp] = prompts

    def rows(x, fill):
        return np.concatenate([x, np.full(pad_rows, fill, x.dtype)])

    # numpy, not jnp.asarray: the jitted call transfers its numpy arguments in one go, where eleven
    # separate jnp.asarray calls cost ~0.35 ms per call (5% of a batch-1 prefill-only call)
    sampling = SamplingBatch(temperature=rows(temperature, 0), top_k=rows(top_k, 0), top_p=rows(top_p, 1),
                             seed=rows(seeds, 0), index=np.zeros(bb, np.int32), position=np.zeros(bb, np.int32))
    arrays = dict(prompts=padded_prompts, prompt_lens=rows(lens, 1), max_tokens=rows(max_tokens, 1),
                  sampling=sampling, eos=np.int32(-2 if eos_token_id is None else eos_token_id),  # -2 never matches
                  real=np.arange(bb) < b)
    pages = -(-(lpb + cap + gamma + 1) // block_size)
    static = dict(gamma=gamma, block_size=block_size, pages_per_seq=pages, capacity=cap)
    return arrays, static, b, int(max_tokens.max())


def _run(program, target_params, target_config, draft_params, draft_config, prompts, prompt_lens, *, gamma,
         max_tokens, temperature, top_k, top_p, seeds, eos_token_id, block_size, attention_impl, **extra):
    arrays, static, b, n = _prepare(target_config, draft_config, prompts, prompt_lens, gamma, max_tokens,
                                    temperature, top_k, top_p, seeds, eos_token_id, block_size)
    tokens, num_generated, metrics = program(target_params, draft_params, **arrays, target_config=target_config,
                                             draft_config=draft_config, attention_impl=attention_impl, **static,
                                             **extra)
    if tokens.shape == (b, n):  # no padding to cut: each eager slice is a dispatch (~25 us, 8 of them)
        return tokens, num_generated, metrics
    return tokens[:b, :n], num_generated[:b], jax.tree.map(lambda x: x[:b], metrics)


def speculative_generate(target_params: dict, target_config: ModelConfig, draft_params: dict,
                         draft_config: ModelConfig, prompts, prompt_lens, *, gamma: int = 4, max_tokens=32,
                         temperature=0.0, top_k=0, top_p=1.0, seeds=0, eos_token_id: int | None = None,
                         block_size: int = 16, attention_impl: str = "auto", draft_head: DraftHead | None = None):
    """Generates with a draft model proposing ``gamma`` tokens per round, exactly as the target would sample.

    prompts: i32[B, Lp] right-padded; prompt_lens: i32[B] (each >= 1). max_tokens, temperature
    (0 = greedy), top_k (0 = off), top_p (1 = off) and seeds are scalars or per-row arrays [B].
    ``draft_head``: the draft proposes only these tokens (``jaxserve.speculative.draft_vocab.restrict_head``).
    Returns ``(tokens i32[B, max(max_tokens)], num_generated i32[B], SpecMetrics)``; a row's tokens
    end at its EOS (included) or its max_tokens, and later slots hold -1.
    """
    if draft_head is not None:
        check_draft_head(draft_head, draft_config)
    return _run(_speculative_program, target_params, target_config, draft_params, draft_config, prompts,
                prompt_lens, gamma=gamma, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                top_p=top_p, seeds=seeds, eos_token_id=eos_token_id, block_size=block_size,
                attention_impl=attention_impl, draft_head=draft_head)


def target_only_generate(target_params: dict, target_config: ModelConfig, prompts, prompt_lens, *,
                         max_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seeds=0,
                         eos_token_id: int | None = None, block_size: int = 16, attention_impl: str = "auto"):
    """The autoregressive baseline: same interface and outputs as ``speculative_generate`` (metrics with γ = 0)."""
    return _run(_target_only_program, target_params, target_config, None, None, prompts, prompt_lens, gamma=1,
                max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
                eos_token_id=eos_token_id, block_size=block_size, attention_impl=attention_impl)


def ngram_generate(target_params: dict, target_config: ModelConfig, prompts, prompt_lens, *, gamma: int = 4,
                   max_ngram: int = 3, min_ngram: int = 1, max_tokens=32, temperature=0.0, top_k=0, top_p=1.0,
                   seeds=0, eos_token_id: int | None = None, block_size: int = 16, attention_impl: str = "auto"):
    """``speculative_generate`` with n-gram prompt lookup proposing (no draft model); same outputs."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    return _run(_ngram_program, target_params, target_config, None, None, prompts, prompt_lens, gamma=gamma,
                max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
                eos_token_id=eos_token_id, block_size=block_size, attention_impl=attention_impl,
                max_ngram=max_ngram, min_ngram=min_ngram)


def medusa_generate(target_params: dict, target_config: ModelConfig, heads_params: dict, heads_config, prompts,
                    prompt_lens, *, gamma: int = 4, max_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seeds=0,
                    eos_token_id: int | None = None, block_size: int = 16, attention_impl: str = "auto"):
    """``speculative_generate`` with Medusa heads (``jaxserve.speculative.medusa``) proposing; same outputs."""
    check_medusa_matches(target_config, heads_config, gamma)
    return _run(_medusa_program, target_params, target_config, heads_params, None, prompts, prompt_lens,
                gamma=gamma, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
                eos_token_id=eos_token_id, block_size=block_size, attention_impl=attention_impl,
                heads_config=heads_config)


def eagle_generate(target_params: dict, target_config: ModelConfig, draft_params: dict, draft_config: ModelConfig,
                   head: DraftHead, prompts, prompt_lens, *, gamma: int = 4, max_tokens=32, temperature=0.0, top_k=0,
                   top_p=1.0, seeds=0, eos_token_id: int | None = None, block_size: int = 16,
                   attention_impl: str = "auto"):
    """``speculative_generate`` with an EAGLE draft proposing (``jaxserve.speculative.eagle``; ``head``: the
    target's head cut to the draft's tokens, ``eagle_head``); same outputs."""
    check_eagle_matches(target_config, draft_config, np.asarray(head.token_ids))
    return _run(_eagle_program, target_params, target_config, draft_params, draft_config, prompts, prompt_lens,
                gamma=gamma, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
                eos_token_id=eos_token_id, block_size=block_size, attention_impl=attention_impl, draft_head=head)


def suffix_generate(target_params: dict, target_config: ModelConfig, prompts, prompt_lens, *, gamma: int = 4,
                    max_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seeds=0, eos_token_id: int | None = None,
                    block_size: int = 16, attention_impl: str = "auto", cache: SuffixCache | None = None):
    """``speculative_generate`` with suffix decoding proposing (``jaxserve.speculative.suffix_tree``); same
    outputs. Each round a row drafts 0..``gamma`` tokens from its suffix trees (its prompt and outputs so
    far, and ``cache``'s global tree of earlier outputs); the target verifies them exactly (``suffix_round``),
    in a program as wide as the round's longest draft rounded up to a power of two (capped at γ; at most
    ceil(log2 γ) + 1 round programs per bucket): rounds whose contexts matched little verify few slots.

    ``cache``: a ``SuffixCache`` (its depth, adaptive-length factor, probability floor and global bound
    apply) that keeps this call's outputs for later calls; None: a fresh default one.

    Unlike the other generators this is not one ``lax.while_loop``: the trees are dynamic host
    structures (tries of Python dicts that grow with every token) that no traced program can hold, and
    a host callback inside the loop would stop the device every round anyway. So the loop runs on the
    host: one jitted round per iteration (the KV pool and the loop state stay on the device, donated),
    a sync per round for the emitted tokens, the trees updated between rounds.
    """
    cache = SuffixCache() if cache is None else cache
    if not isinstance(cache, SuffixCache):
        raise ValueError(f"cache must be a SuffixCache or None, got {type(cache).__name__}")
    return _run(_suffix_program, target_params, target_config, None, None, prompts, prompt_lens, gamma=gamma,
                max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
                eos_token_id=eos_token_id, block_size=block_size, attention_impl=attention_impl, cache=cache)
