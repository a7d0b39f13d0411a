"""The device side of speculative decoding in the engine: one round per step for the decoding sequences.

Axis names: T packed tokens, B sequences, M pages per sequence, G draft tokens (γ), E hidden size.

Each engine step splits the scheduled entries in two:
- fill entries (prefill chunks, recompute after preemption, and decodes the token budget left
  without lookahead) run one packed target pass, sample where an entry ends, and run the draft
  over the same tokens at the same slots, so the draft's pool covers what the target's does;
- round entries (decodes the scheduler gave ``num_lookahead = γ`` slots) run ONE round of
  ``spec_round`` / ``ngram_round`` / ``medusa_round``, the functions ``jaxserve.speculative.generate``
  runs inside its ``lax.while_loop``.
The target pool is the ``ModelRunner``'s; the draft pool has the same blocks and is addressed by
the same block tables, so block copies (copy-on-write) apply to both. Rollback is lengths only:
the scheduler keeps the accepted tokens and returns the lookahead slots. Medusa's per-sequence
state (the target's hidden before the last token) stays on the host between steps; any stale or
missing value only lowers acceptance, never exactness.

Programs are bucketed: fill by (T, M) as the runner's mixed step, rounds by (B, M);
``num_compilations`` counts traces, ``num_buckets`` bounds them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.cache.kv_pool import KVPool, copy_blocks, init_kv_pool
from jaxserve.config import ModelConfig
from jaxserve.engine.buckets import bucket, powers_of_two
from jaxserve.engine.runner import WARMUP_READER, ModelRunner, SampleRow, _pack, _sampling_arrays
from jaxserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from jaxserve.models.attention import k_tokens_minor, resolve_impl
from jaxserve.models.loading import to_device
from jaxserve.models.transformer import forward
from jaxserve.quant import matmul_context
from jaxserve.sampling import SamplingBatch, token_logprobs
from jaxserve.speculative.config import SpeculativeConfig
from jaxserve.speculative.hidden import forward_with_hidden
from jaxserve.speculative.medusa import medusa_round
from jaxserve.speculative.metrics import SpecMetrics, summarize
from jaxserve.speculative.ngram import ngram_round
from jaxserve.speculative.rejection import sample_tokens
from jaxserve.speculative.round import RoundInputs, spec_round


@dataclasses.dataclass(frozen=True)
class Proposer:
    """What proposes: ``method`` and its weights (a draft ``ModelConfig`` or a ``MedusaConfig``, and params;
    none for ngram); ``head``: a draft restricted to its most frequent tokens (``jaxserve.speculative.draft_vocab``)."""
    method: str
    config: Any = None
    params: Any = None
    head: Any = None


class SpecRunner:
    def __init__(self, runner: ModelRunner, spec: SpeculativeConfig, proposer: Proposer, max_model_len: int):
        proposer = dataclasses.replace(proposer, params=to_device(proposer.params))  # as ModelRunner's params
        self.runner, self.spec, self.proposer = runner, spec, proposer
        self.gamma = spec.gamma
        bs = runner.block_size
        max_pages = -(-(max_model_len + self.gamma) // bs)  # lookahead reaches γ slots past the last token
        if resolve_impl(runner.attention_impl) == "xla":  # its cost follows live pages: one table width (runner.py)
            self.page_buckets = [max_pages]
        else:
            self.page_buckets = powers_of_two(min(max(1, 128 // bs), max_pages), max_pages)
        self.seq_buckets = powers_of_two(1, runner.max_num_seqs)  # 1 and 2 too: speculation pays at low load
        self.draft_pool: KVPool = []
        if proposer.method == "draft_model":
            c = proposer.config
            num_blocks = runner.pool[0][0].shape[0]
            self.draft_pool = init_kv_pool(c.num_layers, num_blocks, bs, c.num_kv_heads, c.head_dim, jnp.dtype(c.dtype),
                                           k_tokens_minor=k_tokens_minor(runner.attention_impl))
        self._hidden: dict[int, np.ndarray] = {}  # Medusa: seq_id -> target hidden f32[E] before its last token
        self.reset_metrics()
        self.num_compilations = 0
        self._static = dict(target_config=runner.config, proposer_config=proposer.config, method=proposer.method,
                            attention_impl=runner.attention_impl, quant=runner.quant)

    @property
    def num_buckets(self) -> int:
        """Upper bound on the programs this runner compiles (fill, round, block copy)."""
        fill = len(self.runner.token_buckets) * len(self.runner.page_buckets)
        return fill + len(self.seq_buckets) * len(self.page_buckets) + 1

    def execute(self, out: SchedulerOutput, seeds: dict[str, int], seqs: dict
                ) -> tuple[dict[int, int | list[int]], dict[tuple[str, int], list[float]]]:
        """Runs one scheduled step; returns what ``Scheduler.update`` takes (a round's emitted tokens as a list)
        and, per (request id, sample index), the new tokens' log-probabilities under the target's raw
        logits, in order (a round's may run past a stop the scheduler cuts at: the engine keeps as many
        as it keeps tokens)."""
        self.runner.copy_blocks(out.copies)
        self._copy_draft_blocks(out.copies)
        fill = [e for e in out.scheduled if not e.num_lookahead]
        rounds = [e for e in out.scheduled if e.num_lookahead]
        sampled, logprobs = self._fill(fill, seeds) if fill else ({}, {})
        if rounds:
            more, more_logprobs = self._round(rounds, seeds, seqs)
            sampled.update(more)
            logprobs.update(more_logprobs)
        live = {e.seq_id for e in out.scheduled} | set(seqs)
        self._hidden = {k: v for k, v in self._hidden.items() if k in live}
        return sampled, logprobs

    def warmup(self) -> int:
        """Compiles and runs every fill and round bucket once, and the block copies; returns the programs compiled.

        The speculative engine runs only these programs (``ModelRunner.warmup`` would compile the plain
        steps, which it never runs). Nothing is written: the fill's one token has no slot, and every
        round row is inactive (its writes are dropped) but attends to a cached slot, so the attention
        loops run once here rather than for the first time in the middle of serving.
        """
        before = self.num_compilations + self.runner.num_compilations
        r = self.runner
        sbatch, sample_entry = _sampling_arrays([], r.max_num_seqs)  # _fill's one sampling shape
        for num_tokens in r.token_buckets:
            for num_pages in r.page_buckets:
                arrays = _pack([WARMUP_READER], num_tokens, r.max_num_seqs, num_pages)
                _, _, _, r.pool, self.draft_pool = self._counted(
                    _fill_program, r.params, self.proposer.params, r.pool, self.draft_pool, arrays["tokens"],
                    arrays["positions"], r.metadata(arrays), arrays["last"], sample_entry, sbatch, **self._static)
        for b in self.seq_buckets:
            for m in self.page_buckets:
                inputs, extra = self._round_inputs([], {}, {}, b, m)
                _, _, _, _, r.pool, self.draft_pool = self._counted(
                    _round_program, r.params, self.proposer.params, r.pool, self.draft_pool, inputs, extra,
                    gamma=self.gamma, max_ngram=self.spec.max_ngram, min_ngram=self.spec.min_ngram, **self._static)
        r.copy_blocks([(0, 0)])  # self-copies: harmless
        self._copy_draft_blocks([(0, 0)])
        return self.num_compilations + r.num_compilations - before

    def _copy_draft_blocks(self, copies: list[tuple[int, int]]) -> None:
        """The draft pool's copy-on-write copies, padded to the runner's one size (dst -1 is dropped)."""
        if not copies or not self.draft_pool:
            return
        n = bucket(len(copies), powers_of_two(self.runner.max_num_seqs, len(copies)))
        src, dst = np.zeros(n, np.int32), np.full(n, -1, np.int32)
        src[: len(copies)], dst[: len(copies)] = zip(*copies)
        self.draft_pool = self._counted(_copy, self.draft_pool, jnp.asarray(src), jnp.asarray(dst))

    def reset_metrics(self) -> None:
        """Zeroes the acceptance counters (host-side, one row: the whole engine)."""
        z = np.zeros(1, np.int64)
        self._metrics = SpecMetrics(z, z, z, np.zeros((1, self.gamma), np.int64), z, z)

    def record_generated(self, num_tokens: int) -> None:
        self._metrics = self._metrics.replace(generated=self._metrics.generated + num_tokens)

    def stats(self) -> dict:
        s = summarize(self._metrics)
        keep = ("acceptance_rate", "token_acceptance_prob", "mean_acceptance_length", "per_position_acceptance",
                "target_calls_per_token", "rounds", "drafted", "accepted", "generated", "target_calls")
        return {"spec_method": self.proposer.method, "spec_gamma": self.gamma,
                **{f"spec_{k}": s[k] for k in keep}, "spec_compilations": self.num_compilations,
                "spec_buckets": self.num_buckets}

    # ---- fill: prefill chunks and plain decodes, target and draft together ---------------------

    def _fill(self, entries: list[ScheduledSequence], seeds: dict[str, int]):
        r = self.runner
        num_pages = bucket(max(len(e.block_table) for e in entries), r.page_buckets)
        num_tokens = bucket(sum(len(e.token_ids) for e in entries), r.token_buckets)
        arrays = _pack(entries, num_tokens, r.max_num_seqs, num_pages)
        rows = [SampleRow(i, e.index + j, e.sampling_params.temperature, e.sampling_params.top_k,
                          e.sampling_params.top_p, seeds[e.request_id], e.context_len)
                for i, e in enumerate(entries) if e.sample for j in range(e.num_samples)]
        sbatch, sample_entry = _sampling_arrays(rows, bucket(len(rows), powers_of_two(r.max_num_seqs, len(rows))))
        meta = r.metadata(arrays)
        toks, lps, hidden, r.pool, self.draft_pool = self._counted(
            _fill_program, r.params, self.proposer.params, r.pool, self.draft_pool, arrays["tokens"],
            arrays["positions"], meta, arrays["last"], sample_entry, sbatch, **self._static)
        toks, lps, hidden = jax.device_get((toks, lps, hidden))
        sampled, logprobs, k = {}, {}, 0
        for e in entries:
            if e.sample:
                drawn = [int(t) for t in toks[k:k + e.num_samples]]
                sampled[e.seq_id] = drawn if e.num_samples > 1 else drawn[0]
                for j in range(e.num_samples):
                    logprobs[(e.request_id, e.index + j)] = [float(lps[k + j])]
                if self.proposer.method == "medusa":
                    self._hidden[e.seq_id] = hidden[k]
                k += e.num_samples
        self._metrics = self._metrics.replace(target_calls=self._metrics.target_calls + len(rows))
        return sampled, logprobs

    # ---- rounds: one speculative round for every decode with lookahead --------------------------

    def _round(self, entries: list[ScheduledSequence], seeds: dict[str, int], seqs: dict):
        b = bucket(len(entries), self.seq_buckets)
        m = bucket(max(len(e.block_table) for e in entries), self.page_buckets)
        inputs, extra = self._round_inputs(entries, seeds, seqs, b, m)
        toks, num_accepted, lps, state, self.runner.pool, self.draft_pool = self._counted(
            _round_program, self.runner.params, self.proposer.params, self.runner.pool, self.draft_pool, inputs,
            extra, gamma=self.gamma, max_ngram=self.spec.max_ngram, min_ngram=self.spec.min_ngram, **self._static)
        toks, num_accepted, lps, state = jax.device_get((toks, num_accepted, lps, state))
        out, logprobs = {}, {}
        for i, e in enumerate(entries):
            out[e.seq_id] = toks[i, :num_accepted[i] + 1].tolist()
            logprobs[(e.request_id, e.index)] = lps[i, :num_accepted[i] + 1].tolist()
            if self.proposer.method == "medusa":
                self._hidden[e.seq_id] = state[i]
        self._record_rounds(num_accepted[:len(entries)])
        return out, logprobs

    def _round_inputs(self, entries, seeds, seqs, b: int, m: int) -> tuple[RoundInputs, Any]:
        tables = np.zeros((b, m), np.int32)
        cols = {name: np.zeros(b, dtype) for name, dtype in (("positions", np.int32), ("prev", np.int32),
                                                             ("last", np.int32), ("top_k", np.int32),
                                                             ("seed", np.uint32), ("index", np.int32),
                                                             ("temperature", np.float32))}
        cols["positions"][:] = 1  # padding rows: any valid position (they write nothing)
        top_p = np.ones(b, np.float32)
        bs = self.runner.block_size
        history = np.zeros((b, m * bs), np.int32) if self.proposer.method == "ngram" else None
        hidden = np.zeros((b, self.runner.config.hidden_size), np.float32) \
            if self.proposer.method == "medusa" else None
        for i, e in enumerate(entries):
            seq, sp, pos = seqs[e.seq_id], e.sampling_params, e.start_pos
            tables[i, :len(e.block_table)] = e.block_table
            cols["positions"][i], cols["last"][i] = pos, e.token_ids[0]
            cols["prev"][i] = seq.token_slice(pos - 1, pos)[0]
            cols["temperature"][i], cols["top_k"][i], top_p[i] = sp.temperature, sp.top_k, sp.top_p
            cols["seed"][i], cols["index"][i] = seeds[e.request_id], e.index
            if history is not None:
                history[i, :pos + 1] = seq.token_slice(0, pos + 1)
            if hidden is not None:
                hidden[i] = self._medusa_state(seq)
        # numpy leaves: jit moves them itself, cheaper than a jnp.asarray each (runner._pack)
        sampling = SamplingBatch(temperature=cols["temperature"], top_k=cols["top_k"], top_p=top_p,
                                 seed=cols["seed"], index=cols["index"], position=np.zeros(b, np.int32))
        inputs = RoundInputs(block_tables=tables, positions=cols["positions"], prev_tokens=cols["prev"],
                             last_tokens=cols["last"], active=np.arange(b) < len(entries), sampling=sampling)
        if self.proposer.method == "draft_model":
            return inputs, self.proposer.head
        return inputs, history if history is not None else hidden

    def _medusa_state(self, seq) -> np.ndarray:
        """The sequence's hidden; a forked sample starts from its request's prompt hidden (same position)."""
        if seq.seq_id in self._hidden:
            return self._hidden[seq.seq_id]
        for other in seq.request.seqs:
            if other.seq_id in self._hidden:
                return self._hidden[other.seq_id]
        return np.zeros(self.runner.config.hidden_size, np.float32)

    def _record_rounds(self, num_accepted: np.ndarray) -> None:
        m, g, rows = self._metrics, self.gamma, len(num_accepted)
        hit = (np.arange(g)[None, :] < num_accepted[:, None]).sum(0)
        self._metrics = m.replace(rounds=m.rounds + rows, drafted=m.drafted + g * rows,
                                  accepted=m.accepted + int(num_accepted.sum()), accepted_at=m.accepted_at + hit,
                                  target_calls=m.target_calls + rows)

    def _counted(self, fn, *args, **kwargs):
        before = _TRACES[0]
        result = fn(*args, **kwargs)
        self.num_compilations += _TRACES[0] - before
        return result


_TRACES = [0]
_STATIC = ("target_config", "proposer_config", "method", "attention_impl", "quant")


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("target_pool", "draft_pool"))
def _fill_program(target_params, proposer_params, target_pool, draft_pool, tokens, positions, meta, last,
                  sample_entry, sbatch, *, target_config: ModelConfig, proposer_config, method: str,
                  attention_impl: str, quant=None):
    """Target pass (+ its hidden for Medusa) and draft pass over the same packed tokens; samples rows and
    returns their tokens' log-probabilities under the raw logits. ``quant``: the runner's matmul settings
    for a quantized target (static, as in ``runner._step``); float proposer weights are untouched by it."""
    _TRACES[0] += 1
    with matmul_context(quant):
        if method == "medusa":
            logits, hidden, target_pool = forward_with_hidden(target_params, target_config, tokens, positions,
                                                              target_pool, meta, attention_impl=attention_impl,
                                                              logits_indices=last)
        else:
            logits, target_pool = forward(target_params, target_config, tokens, positions, target_pool, meta,
                                          attention_impl=attention_impl, logits_indices=last)
            hidden = jnp.zeros((last.shape[0], 1), jnp.float32)
        if method == "draft_model":
            _, draft_pool = forward(proposer_params, proposer_config, tokens, positions, draft_pool, meta,
                                    attention_impl=attention_impl, logits_indices=last)
        logits = logits[sample_entry]
        toks = sample_tokens(logits, sbatch)
        return toks, token_logprobs(logits, toks), hidden[sample_entry], target_pool, draft_pool


@functools.partial(jax.jit, static_argnames=_STATIC + ("gamma", "max_ngram", "min_ngram"),
                   donate_argnames=("target_pool", "draft_pool"))
def _round_program(target_params, proposer_params, target_pool, draft_pool, inputs: RoundInputs, extra, *,
                   target_config: ModelConfig, proposer_config, method: str, attention_impl: str, gamma: int,
                   max_ngram: int, min_ngram: int, quant=None):
    """One round for every row; extra is the n-gram history i32[B, H], the Medusa hidden f32[B, E], or the
    draft's restricted head (a ``DraftHead`` or None)."""
    _TRACES[0] += 1
    with matmul_context(quant):
        state = jnp.zeros((), jnp.float32)
        if method == "draft_model":
            r = spec_round(target_params, proposer_params, target_pool, draft_pool, inputs, target_config=target_config,
                           draft_config=proposer_config, gamma=gamma, attention_impl=attention_impl, draft_head=extra)
            draft_pool = r.draft_pool
        elif method == "ngram":
            r = ngram_round(target_params, target_pool, inputs, extra, target_config=target_config, gamma=gamma,
                            max_ngram=max_ngram, min_ngram=min_ngram, attention_impl=attention_impl)
        else:
            r = medusa_round(target_params, proposer_params, target_pool, inputs, extra, target_config=target_config,
                             heads_config=proposer_config, gamma=gamma, attention_impl=attention_impl)
            state = r.draft_pool
        return r.tokens, r.num_accepted, r.logprobs, state, r.target_pool, draft_pool


@functools.partial(jax.jit, donate_argnames=("pool",))
def _copy(pool, src, dst):
    _TRACES[0] += 1
    return copy_blocks(pool, src, dst)
