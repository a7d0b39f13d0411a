"""The jit boundary: one ``ModelRunner`` owns the device state and turns each scheduled step into
device work through ``execute(SchedulerOutput) -> RunnerOutput``.

Axis names: T packed tokens, B sequences, M pages per sequence, R sample rows, E hidden size.

Device state: the target's params, its KV pool (a ``KVPool`` built by the attention backend, so it
carries its layout), an MoE's routing state, and with speculative decoding the proposer's state
(the draft model's pool: same blocks, addressed by the same block tables, so copy-on-write applies
to both; or Medusa's per-sequence hidden, kept on the host between steps: a stale or missing value
only lowers acceptance, never exactness).

A plain runner runs every step as one decode or mixed program. A speculative runner splits a step:
fill entries (prefill chunks, recompute after preemption, decodes the token budget left without
lookahead) run one packed target pass, sample where an entry ends, and run the draft over the same
tokens; round entries (decodes the scheduler gave ``num_lookahead = γ`` slots) run ONE round of
``spec_round`` / ``ngram_round`` / ``medusa_round``, the functions ``speculative_generate`` runs inside
its ``lax.while_loop``, or ``suffix_round`` over drafts this runner's host suffix trees made.
Rollback is lengths only: the scheduler keeps the accepted tokens.
The programs (``step_programs``) are bucketed (``batching.BucketPolicy``); ``num_compilations``
counts the traces this runner's calls caused, ``num_buckets`` bounds them.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.cache.block_manager import table_slots
from jaxserve.config import ModelConfig
from jaxserve.engine import step_programs as programs
from jaxserve.engine.draft_coverage import DraftCoverage
from jaxserve.engine.batching import (BucketPolicy, PackedStep, RunnerOutput, SampleRow, collect_samples, pack,
                                      sample_rows, sampling_columns)
from jaxserve.engine.proposer import DRAFT_POOL_METHODS, HIDDEN_METHODS, Proposer
from jaxserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from jaxserve.kernels.cpu import packed_impl
from jaxserve.kernels.cpu.int8_head import with_int8_head
from jaxserve.kernels.cpu.packed import pack_bf16, pack_dense_kernels, pack_tied_head
from jaxserve.models.attention import AttentionMetadata
from jaxserve.models.attention_backends import attention_backend, new_kv_pool
from jaxserve.models.loading import to_device
from jaxserve.parallel.layout import Layout
from jaxserve.sampling import SamplingBatch
from jaxserve.speculative.config import SpeculativeConfig
from jaxserve.speculative.eagle import eagle_head
from jaxserve.speculative.round import RoundInputs
from jaxserve.speculative.suffix_tree import SuffixCache


class CarriedHidden(NamedTuple):
    """What a Medusa or EAGLE runner keeps per sequence between steps: the target's hidden before the sequence's
    last token f32[E], or after an EAGLE round f32[2, E] (that hidden, then the draft's f̂ at the last token), and
    whether that round left the sequence drafted (its next round skips the draft's first step: ``eagle_round``)."""
    seq: object
    hidden: np.ndarray
    drafted: bool = False


def fetch(tree):
    """Device results -> numpy; a replicated array spanning other processes' devices is read from a local copy."""
    return jax.tree.map(lambda x: np.asarray(x if x.is_fully_addressable else x.addressable_data(0)), tree)


# Warm-up's one token: position 0, attending to one cached slot, written nowhere (slot -1).
WARMUP_READER = ScheduledSequence(seq_id=-1, request_id="", index=0, token_ids=[0], start_pos=0, block_table=[0],
                                  slot_mapping=[-1], sample=False, num_samples=0, sampling_params=None)


def _piece(e: ScheduledSequence, start: int, n: int, block_size: int) -> ScheduledSequence:
    """Tokens [start, start + n) of ``e``'s sequence as an entry of their own (no sample): a draft catch-up piece."""
    return ScheduledSequence(e.seq_id, e.request_id, e.index, e.seq.token_slice(start, start + n), start,
                             e.block_table, table_slots(e.block_table, start, start + n, block_size), False, 0,
                             e.sampling_params, seq=e.seq)


def packs_weights(config: ModelConfig) -> bool:
    """Whether a runner packs the model's Dense kernels (``jaxserve.kernels.cpu.packed``; a float32 model's in
    ``packed_f32``: SmolLM2 f32 at batch 64 263 -> 221 ms a decode step, at batch 1 40 -> 32-37 ms, on the Ice Lake
    VM, ``benchmarks/profile_step.py``): bf16 or float32 matmuls on one CPU device with the kernels built
    (``packed_impl``: AMX tiles, or float32 FMAs on a CPU without them; ``JAXSERVE_CPU_KERNELS=0`` turns it off).
    Every row count then runs the same packed GEMM, with no packing per
    call (on AMX, SmolLM2 bf16 end to end: batch 1 1.11x, 64 1.07x, ShareGPT 1.15x; without AMX, at batch 64 in place
    of XLA's bf16 dot: benchmarks/RESULTS.md), and q/k/v and gate/up run as one GEMM each
    (``jaxserve.kernels.cpu.packed.FUSIONS``). A row's matmuls then give the same bits in any batch and at any row
    count: with RMSNorm's and the sampler's ``row_sum`` and ``KVLayer.write``'s lone-row write, a request decodes
    alone as in a batch (bf16: tests/engine/test_smollm2.py; float32: tests/kernels/test_cpu_packed_f32.py), and
    greedy speculation gives the plain engine's bits (tests/engine/test_smollm2.py)."""
    return packed_dtype(config) is not None


def packed_dtype(config: ModelConfig):
    """The dtype of the Dense kernels a runner packs (``packs_weights``): bfloat16 (``PackedBf16``) for bf16 matmuls,
    float32 (``PackedF32``, float32 FMAs in k order) for a float32 model, or None where the kernels do not load."""
    mm, dtype = jnp.dtype(config.matmul_dtype or config.dtype), jnp.dtype(config.dtype)
    if packed_impl() is None or mm not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)):
        return None
    return None if mm == jnp.float32 != dtype else mm


class ModelRunner:
    def __init__(self, config: ModelConfig, params: dict, *, num_blocks: int, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 attention_impl: str = "auto", quant=None, router_state: dict | None = None,
                 max_num_partial_prefills: int | None = None, speculative: SpeculativeConfig | None = None,
                 proposer: Proposer | None = None, layout: Layout | None = None, weight_layout: str = "auto",
                 lm_head_quantization: str | None = None, num_scheduler_steps: int = 1):
        if (speculative is None) != (proposer is None):
            raise ValueError("speculative and proposer come together (both None for a plain runner)")
        if num_scheduler_steps < 1 or (num_scheduler_steps > 1 and speculative is not None):
            raise ValueError(f"num_scheduler_steps={num_scheduler_steps} must be >= 1, and 1 with speculative decoding")
        # a mesh: config and params as the layout runs them (KV heads replicated up to T), placed by the rule table
        self.layout = layout
        if layout is not None:
            config, params = layout.prepare(config, params)
        # numpy params would be copied in every step
        self.config, self.params = config, to_device(params) if layout is None else layout.place_params(params)
        unpacked = self.params  # (an EAGLE draft's head is cut from the target's head as stored)
        pack = layout is None and weight_layout == "auto"  # (EngineConfig.weight_layout)
        if lm_head_quantization == "int8":  # (EngineConfig.lm_head_quantization: one device)
            self.params = with_int8_head(self.params, config.tie_word_embeddings)
        dtype = packed_dtype(config) if pack else None  # (packs_weights)
        if dtype is not None:
            self.params = pack_dense_kernels(self.params, dtype=dtype)
            if config.tie_word_embeddings and lm_head_quantization is None:  # (not the draft's: its sampled rounds
                self.params = pack_tied_head(self.params, dtype)                # read its embedding as stored)
        # an MoE's loss-free balancing biases: routing state the model reads, never trained here
        self.router_state = None if router_state is None else jax.tree.map(jnp.asarray, router_state)
        if layout is not None and router_state is not None:
            self.router_state = layout.place_params(router_state)  # replicated: no rule matches
        self.block_size, self.max_num_seqs = block_size, max_num_seqs
        self.max_chunks = max_num_partial_prefills  # the scheduler's cap on multi-token entries per step
        self.attention_impl = attention_impl
        self.quant = quant  # jaxserve.quant.MatmulSettings when params hold QuantizedTensors
        self.speculative = speculative
        self.num_scheduler_steps = num_scheduler_steps  # K: a multi-step decode's steps (``_multi_step``)
        self.gamma = speculative.gamma if speculative else 0
        # a step the speculation policy ran plain: its decodes run the fill program in decode shapes (B, not
        # max_num_seqs x the smallest token bucket), what a plain engine's decode step costs (a draft model's or
        # an EAGLE draft's pass is skipped there and caught up before the sequence's next round: ``_catch_up_draft``)
        self.plain_decodes = speculative is not None and (speculative.adaptive
                                                          or speculative.disable_by_batch_size is not None)
        self.buckets = BucketPolicy(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                    max_model_len=max_model_len, block_size=block_size,
                                    live_pages_only=attention_backend(attention_impl).name == "xla",
                                    lookahead=self.gamma, narrow_rounds=proposer is not None
                                    and proposer.method == "suffix")
        build_pool = lambda: new_kv_pool(config, num_blocks, block_size, attention_impl)  # noqa: E731
        self.pool = build_pool() if layout is None else layout.new_pool(build_pool)
        self.proposer, self.draft_pool = None, None
        if proposer is not None:
            # on a mesh the proposer (draft model, Medusa heads) and its pool are replicated: it is small
            place = to_device if layout is None else layout.place_replicated
            self.proposer = dataclasses.replace(proposer, params=place(proposer.params), head=place(proposer.head))
            if pack and proposer.method in DRAFT_POOL_METHODS and packs_weights(proposer.config):
                self.proposer = dataclasses.replace(self.proposer, params=pack_dense_kernels(
                    self.proposer.params, dtype=packed_dtype(proposer.config)))
            if proposer.method == "eagle":  # its head: the target's own, cut to the draft's token ids
                head = eagle_head(unpacked, config, proposer.head)
                if pack and packs_weights(proposer.config) and head.kernel.dtype == jnp.bfloat16:
                    head = head.replace(kernel=pack_bf16(head.kernel))  # greedy drafts: packed_argmax
                self.proposer = dataclasses.replace(self.proposer, head=head)
            if proposer.method in DRAFT_POOL_METHODS:
                build_draft = lambda: new_kv_pool(proposer.config, num_blocks, block_size, attention_impl)  # noqa: E731
                self.draft_pool = build_draft() if layout is None else layout.new_pool(build_draft, sharded=False)
        # Medusa and EAGLE: seq_id -> what its next step reads (CarriedHidden)
        self._hidden: dict[int, CarriedHidden] = {}
        # suffix decoding: the host trees, and the live sequences whose outputs join the global tree at the end
        self._suffix = None if proposer is None or proposer.method != "suffix" else SuffixCache(
            speculative.suffix_max_depth, speculative.suffix_max_cached_requests, speculative.suffix_spec_factor,
            speculative.suffix_min_token_prob)
        self._suffix_seqs: dict[int, object] = {}
        # draft model, EAGLE: which positions the draft's pool holds per sequence, and what a round must catch up
        self.coverage = (DraftCoverage(eagle=proposer.method == "eagle")
                         if proposer is not None and proposer.method in DRAFT_POOL_METHODS else None)
        self.draft_catch_up_tokens = 0  # positions the draft ran over alone, after plain steps skipped them
        self.num_compilations = 0

    @property
    def num_buckets(self) -> int:
        """Upper bound on distinct step programs (plus the copy program)."""
        return self.buckets.num_programs(self.speculative is not None) + \
            (len(self.buckets.decode_shapes()) if self.num_scheduler_steps > 1 else 0) + \
            (len(self.buckets.decode_shapes()) if self.plain_decodes else 0) + \
            (len(self.buckets.mixed_shapes()) if self._catches_up else 0) + \
            (len(self.buckets.round_shapes()) if self.proposer and self.proposer.method == "eagle" else 0) + \
            (self.draft_pool is not None)  # (the block copy of the draft's pool: another shape)

    @property
    def _catches_up(self) -> bool:
        """Whether plain decode steps skip the draft (a draft model, an EAGLE draft), so rounds may first catch it
        up."""
        return self.plain_decodes and self.proposer.method in DRAFT_POOL_METHODS

    def execute(self, out: SchedulerOutput, *, top_logprobs: bool = False, logprobs: bool = True) -> RunnerOutput:
        """Runs one scheduled step (block copies first). ``top_logprobs`` (plain runner only, for beam
        search): also each sampling sequence's most likely next tokens. ``logprobs=False``: the drawn tokens'
        log-probs are neither computed nor returned (``RunnerOutput.logprobs`` stays empty)."""
        self._copy_blocks(out.copies)
        if self.speculative is None:
            return self._plain(out.scheduled, out.num_batched_tokens, top_logprobs, logprobs or top_logprobs)
        if top_logprobs:
            raise ValueError("top_logprobs needs a runner without speculative decoding")
        if self._suffix is not None:
            self._retire_suffix(out.scheduled)
        fill = [e for e in out.scheduled if not e.num_lookahead]
        rounds = [e for e in out.scheduled if e.num_lookahead]
        result = self._fill(fill, logprobs) if fill else RunnerOutput()
        if rounds:
            result.merge(self._round(rounds, logprobs))
        self._hidden = {k: v for k, v in self._hidden.items() if not v.seq.is_finished}
        if self.coverage is not None:
            self.coverage.retire()
        return result

    def warmup(self) -> int:
        """Compiles and runs every bucket's program once (the pools are not written); returns the
        programs compiled. Afterwards a workload compiles nothing new.

        Each batch holds one token that attends to one cached slot and writes nowhere (every round
        row is inactive but reads a cached slot): with no live token at all, the attention loops
        would run zero times and their first real run would still pay ~30 ms of one-off cost in
        the middle of serving. A speculative runner compiles only its fill and round programs.
        """
        before = self.num_compilations
        if self.speculative is None:
            for shape in self.buckets.decode_shapes() + self.buckets.mixed_shapes():
                self._run_plain(pack([WARMUP_READER], *shape), [], False, False)
            for shape in self.buckets.decode_shapes() if self.num_scheduler_steps > 1 else []:
                self._run_multi_step([WARMUP_READER], pack([WARMUP_READER], *shape), [], False)
        else:
            for shape in self.buckets.mixed_shapes() + (self.buckets.decode_shapes() if self.plain_decodes else []):
                step = pack([WARMUP_READER], *shape)
                self._run_fill(step, [], False, self._entry_features(step, []))
            for shape in self.buckets.mixed_shapes() if self._catches_up else []:
                self._run_catch_up(pack([WARMUP_READER], *shape))
            for b, m in self.buckets.round_shapes():
                inputs, extra = self._round_inputs([], b, m)
                for width in self.buckets.round_widths if self._suffix is not None else [None]:
                    for first_step in (True, False) if self.proposer.method == "eagle" else (True,):
                        self._run_round(inputs, extra if width is None else (extra[0][:, :width], extra[1]), False,
                                        first_step)
        self._copy_blocks([(0, 0)])  # a self-copy: harmless
        return self.num_compilations - before

    # ---- plain steps ---------------------------------------------------------------------------

    def _plain(self, entries: list[ScheduledSequence], num_batched_tokens: int, top_logprobs: bool,
               logprobs: bool) -> RunnerOutput:
        # (beam search's top candidates come from single steps: a multi-step's entries then emit one token each)
        if not top_logprobs and any(e.num_lookahead for e in entries):
            return self._multi_step(entries, logprobs)
        rows = sample_rows(entries)
        toks, lps, top_lps, top_ids = self._run_plain(pack(entries, *self.buckets.step(entries, num_batched_tokens)),
                                                      rows, top_logprobs, logprobs)
        result = collect_samples(entries, len(rows), toks, lps)
        if not logprobs:
            result.logprobs.clear()
        if top_logprobs:
            for k, row in enumerate(rows):
                result.top.setdefault(entries[row.entry].seq_id, (top_lps[k], top_ids[k]))
        return result

    def _run_plain(self, step: PackedStep, rows, top_logprobs: bool, logprobs: bool) -> tuple[np.ndarray, ...]:
        args, kwargs = self._plain_args(step, rows, top_logprobs, logprobs)
        results, self.pool = self._counted(programs.plain_step, *args, **kwargs)
        return tuple(r[: len(rows)] for r in fetch(results))

    def _multi_step(self, entries: list[ScheduledSequence], logprobs: bool) -> RunnerOutput:
        """A decode step whose entries the scheduler gave further steps (``num_lookahead``, multi-step decoding)
        runs ``num_scheduler_steps`` of them in one program (``step_programs.multi_step``); each entry keeps its
        first 1 + num_lookahead tokens, which ``Scheduler.update`` takes as a round's."""
        step = pack(entries, *self.buckets.step(entries, len(entries)))
        rows = sample_rows(entries)
        toks, lps = self._run_multi_step(entries, step, rows, logprobs)
        result = RunnerOutput(target_rows=sum(1 + e.num_lookahead for e in entries))
        for i, e in enumerate(entries):
            result.sampled[e.seq_id] = toks[: 1 + e.num_lookahead, i].tolist()
            if logprobs:
                result.logprobs[(e.request_id, e.index)] = lps[: 1 + e.num_lookahead, i].tolist()
        return result

    def _run_multi_step(self, entries, step: PackedStep, rows, logprobs: bool) -> tuple[np.ndarray, np.ndarray]:
        """``multi_step`` over a decode-only ``step`` of ``entries`` (one draw each): tokens i32[K, R] and their
        log-probs f32[K, R]. Step k runs entry i at ``start_pos + min(k, num_lookahead)``: a row past its last step
        repeats it, writing nowhere, and reads only the slots its table covers."""
        if not step.decode_only or len(rows) not in (0, len(entries)):  # (none: warm-up)
            raise RuntimeError("a multi-step decode runs one token and one draw per sequence")
        k, b = self.num_scheduler_steps, step.tables.shape[0]
        positions, context = np.tile(step.positions, (k, 1)), np.tile(step.context, (k, 1))
        slots = np.full((k, b), -1, np.int32)
        slots[0] = step.slots
        for i, e in enumerate(entries):
            ahead = np.minimum(np.arange(k), e.num_lookahead)
            positions[:, i], context[:, i] = e.start_pos + ahead, e.start_pos + 1 + ahead
            slots[1: 1 + e.num_lookahead, i] = table_slots(e.block_table, e.start_pos + 1,
                                                           e.start_pos + 1 + e.num_lookahead, self.block_size)
        sbatch, sample_entry = self._sampling(rows, b)
        results, self.pool = self._counted(
            programs.multi_step, self.params, self.pool, step.tokens, positions, slots, context, self._metadata(step),
            step.last, sample_entry, sbatch, np.bool_(logprobs), self.router_state, config=self.config,
            attention_impl=self.attention_impl, quant=self.quant, layout=self.layout)
        toks, lps = fetch(results)
        return toks[:, : len(rows)], lps[:, : len(rows)]

    def _plain_args(self, step: PackedStep, rows, top_logprobs: bool, logprobs: bool) -> tuple[tuple, dict]:
        sbatch, sample_entry = self._sampling(rows, step.tables.shape[0])
        return ((self.params, self.pool, step.tokens, step.positions, self._metadata(step), step.last, sample_entry,
                 sbatch, np.bool_(top_logprobs), np.bool_(logprobs), self.router_state),
                dict(config=self.config, attention_impl=self.attention_impl, quant=self.quant, layout=self.layout))

    def lowered(self, shape: tuple[int, int, int, bool]) -> jax.stages.Lowered:
        """The plain step at bucket ``shape`` (one of ``buckets.decode_shapes()`` or ``mixed_shapes()``), lowered
        for this runner's layout and not compiled (its StableHLO text names the collectives); runs nothing."""
        args, kwargs = self._plain_args(pack([WARMUP_READER], *shape), [], False, False)
        return programs.plain_step.lower(*args, **kwargs)

    def compiled_text(self, shape: tuple[int, int, int, bool]) -> str:
        """The compiled HLO of the plain step at bucket ``shape``, for inspecting its collectives
        (``jaxserve.parallel.hlo``); runs nothing."""
        return self.lowered(shape).compile().as_text()

    # ---- speculative fill: prefill chunks and plain decodes, target and draft together ---------

    def _fill(self, entries: list[ScheduledSequence], logprobs: bool) -> RunnerOutput:
        shape = self.buckets.step(entries, sum(len(e.token_ids) for e in entries), allow_decode=self.plain_decodes)
        rows = sample_rows(entries)
        step = pack(entries, *shape)
        features = self._entry_features(step, entries)
        toks, lps, hidden = self._run_fill(step, rows, logprobs, features)
        result = collect_samples(entries, len(rows), toks, lps)
        if not logprobs:
            result.logprobs.clear()
        if self.coverage is not None:  # (an EAGLE draft's features kept in its dtype: what it reads, exactly)
            self.coverage.after_fill(entries, draft_pass=not step.decode_only, features=None if features is None
                                     else features[: len(entries)].astype(jnp.dtype(self.proposer.config.dtype)))
        if self.proposer.method in HIDDEN_METHODS:  # the hidden at each entry's last token
            for k, e in enumerate(entries):
                self._hidden[e.seq_id] = CarriedHidden(e.seq, hidden[k])
        return result

    def _entry_features(self, step: PackedStep, entries) -> np.ndarray | None:
        """EAGLE: the feature each entry's first token reads f32[len(step.last), E], the hidden its last step left
        (zeros at position 0, also when a preempted sequence starts again, and for padding entries); else None."""
        if self.proposer.method != "eagle":
            return None
        features = np.zeros((step.last.shape[0], self.config.hidden_size), np.float32)
        for k, e in enumerate(entries):
            if e.start_pos > 0:
                features[k] = self._carried_hidden(e.seq)
        return features

    def _run_fill(self, step: PackedStep, rows, logprobs: bool, features) -> tuple[np.ndarray, ...]:
        """``features``: ``_entry_features``'."""
        sbatch, sample_entry = self._sampling(rows, self.max_num_seqs)
        toks, lps, hidden, self.pool, self.draft_pool = self._counted(
            programs.fill_step, self.params, self.proposer.params, self.pool, self.draft_pool, step.tokens,
            step.positions, self._metadata(step), step.last, sample_entry, sbatch, np.bool_(logprobs), features,
            **self._speculative_static(), draft_pass=not step.decode_only)
        toks, lps, hidden = jax.device_get((toks, lps, hidden))
        return toks[: len(rows)], lps[: len(rows)], hidden

    # ---- the draft's pool: catching it up over what plain steps skipped -------------------------

    def _catch_up_draft(self, entries: list[ScheduledSequence]) -> None:
        """Before a round: the draft alone over each row's positions it does not hold (``DraftCoverage.catch_up``),
        in packed steps of the mixed shapes, each within the token budget, ``max_num_seqs`` and
        ``max_num_partial_prefills``."""
        max_entries = min(self.max_num_seqs, self.max_chunks or self.max_num_seqs)
        for plan in self.coverage.catch_up(entries, self.buckets.token_buckets[-1], max_entries):
            pieces = [_piece(e, start, n, self.block_size) for e, start, n, _ in plan]
            num_tokens = sum(n for _, _, n, _ in plan)
            step = pack(pieces, *self.buckets.step(pieces, num_tokens, allow_decode=False))
            self._run_catch_up(step, [f for *_, feats in plan for f in feats or ()])
            self.draft_catch_up_tokens += num_tokens

    def _run_catch_up(self, step: PackedStep, features: list[np.ndarray] = ()) -> None:
        """The draft over a catch-up step's packed tokens; an EAGLE draft reads ``features`` (one per token, in
        packing order)."""
        feats = None
        if self.proposer.method == "eagle":
            feats = np.zeros((step.tokens.shape[0], self.config.hidden_size), jnp.dtype(self.proposer.config.dtype))
            if len(features):
                feats[: len(features)] = np.stack(features)
        self.draft_pool = self._counted(programs.draft_catch_up, self.proposer.params, self.params, self.draft_pool,
                                        step.tokens, step.positions, self._metadata(step), feats,
                                        method=self.proposer.method, proposer_config=self.proposer.config,
                                        target_config=self.config, attention_impl=self.attention_impl,
                                        layout=self.layout)

    # ---- speculative rounds: one round for every decode with lookahead --------------------------

    def _round(self, entries: list[ScheduledSequence], logprobs: bool) -> RunnerOutput:
        if self.proposer.method == "draft_model" or self._catches_up:
            self._catch_up_draft(entries)
        inputs, extra = self._round_inputs(entries, *self.buckets.round(entries))
        # an EAGLE round whose rows all carry the draft's f̂ skips the draft's first step (a program of its own)
        first_step = self.proposer.method != "eagle" or not extra[2][: len(entries)].all()
        toks, num_accepted, lps, hidden = self._run_round(inputs, extra, logprobs, first_step)
        result = RunnerOutput(target_rows=len(entries))
        for i, e in enumerate(entries):
            n = int(num_accepted[i])
            if self.proposer.method == "draft_model":  # the next round's L is start_pos + n + 1 (spec_round's)
                self.coverage.after_round(e, e.start_pos + n)
            elif self.proposer.method == "eagle":  # [0, L + n + 1), and L + n + 1 when drafted (eagle_round's)
                self.coverage.after_round(e, e.start_pos + n + 1 + (n < self.gamma))
            result.sampled[e.seq_id] = toks[i, :n + 1].tolist()
            if logprobs:
                result.logprobs[(e.request_id, e.index)] = lps[i, :n + 1].tolist()
            result.accepted[e.seq_id] = n
            if self._suffix is not None:
                result.drafted[e.seq_id] = int(extra[1][i])
            if self.proposer.method in HIDDEN_METHODS:  # (EAGLE: drafted unless all γ were accepted)
                drafted = self.proposer.method == "eagle" and n < self.gamma
                self._hidden[e.seq_id] = CarriedHidden(e.seq, hidden[i], drafted)
        return result

    def _run_round(self, inputs: RoundInputs, extra, logprobs: bool, first_step: bool = True) -> tuple[np.ndarray, ...]:
        s = self.speculative
        toks, num_accepted, lps, hidden, self.pool, self.draft_pool = self._counted(
            programs.round_step, self.params, self.proposer.params, self.pool, self.draft_pool, inputs, extra,
            np.bool_(logprobs), gamma=s.gamma, max_ngram=s.max_ngram, min_ngram=s.min_ngram, first_step=first_step,
            **self._speculative_static())
        return jax.device_get((toks, num_accepted, lps, hidden))

    def _round_inputs(self, entries: list[ScheduledSequence], b: int, m: int) -> tuple[RoundInputs, object]:
        tables = np.zeros((b, m), np.int32)
        positions = np.ones(b, np.int32)  # padding rows: any valid position (they write nothing)
        prev, last = np.zeros(b, np.int32), np.zeros(b, np.int32)
        rows = []
        method = self.proposer.method
        history = np.zeros((b, m * self.block_size), np.int32) if method == "ngram" else None
        hidden = np.zeros((b, self.config.hidden_size), np.float32) if method in HIDDEN_METHODS else None
        drafted = np.zeros(b, bool)
        for i, e in enumerate(entries):
            pos = e.start_pos
            tables[i, :len(e.block_table)] = e.block_table
            positions[i], last[i], prev[i] = pos, e.token_ids[0], e.seq.token_slice(pos - 1, pos)[0]
            sp = e.sampling_params
            rows.append(SampleRow(i, e.index, sp.temperature, sp.top_k, sp.top_p, e.seed, 0))
            if history is not None:
                history[i, :pos + 1] = e.seq.token_slice(0, pos + 1)
            if hidden is not None:
                hidden[i], drafted[i] = self._round_features(e.seq)
        cols = sampling_columns(rows, b)
        sampling = SamplingBatch(temperature=cols["temperature"], top_k=cols["top_k"], top_p=cols["top_p"],
                                 seed=cols["seed"], index=cols["index"], position=np.zeros(b, np.int32))
        inputs = RoundInputs(block_tables=tables, positions=positions, prev_tokens=prev, last_tokens=last,
                             active=np.arange(b) < len(entries), sampling=sampling)
        if method == "suffix":
            return inputs, self._suffix_drafts(entries, b)
        extra = {"draft_model": self.proposer.head, "ngram": history, "medusa": hidden,
                 "eagle": (self.proposer.head, hidden, drafted)}[method]
        return inputs, extra

    def _suffix_drafts(self, entries: list[ScheduledSequence], b: int) -> tuple[np.ndarray, np.ndarray]:
        """Each round row's host draft from its suffix trees, brought up to its last token first:
        drafts i32[B, W] and their lengths i32[B] (0 for padding rows), W the bucketed width of the longest
        (``BucketPolicy.round_width``: rounds whose contexts matched little verify few slots)."""
        drafts, lengths = np.zeros((b, self.gamma), np.int32), np.zeros(b, np.int32)
        for i, e in enumerate(entries):
            have = self._suffix.num_tokens(e.seq_id)
            if have > e.start_pos + 1:  # never expected (tokens only grow): start the sequence's tree again
                self._suffix.finish(e.seq_id)
                have = 0
            self._suffix.extend(e.seq_id, e.seq.token_slice(have, e.start_pos + 1))
            d = self._suffix.propose(e.seq_id, self.gamma).tokens
            drafts[i, :len(d)], lengths[i] = d, len(d)
        return drafts[:, :self.buckets.round_width(int(lengths.max(initial=0)))], lengths

    def _retire_suffix(self, scheduled: list[ScheduledSequence]) -> None:
        """Finished sequences' trees go; their outputs join the global tree (earlier requests' outputs)."""
        for e in scheduled:
            self._suffix_seqs.setdefault(e.seq_id, e.seq)
        for seq_id, seq in list(self._suffix_seqs.items()):
            if seq.is_finished:
                self._suffix.finish(seq_id, seq.output_token_ids)
                del self._suffix_seqs[seq_id]

    def _carried_hidden(self, seq) -> np.ndarray:
        """The sequence's hidden (the target's, before its last token); a forked sample starts from its request's
        prompt hidden (same position)."""
        for s in [seq, *seq.request.seqs]:
            if s.seq_id in self._hidden:
                h = self._hidden[s.seq_id].hidden
                return h[0] if h.ndim == 2 else h
        return np.zeros(self.config.hidden_size, np.float32)

    def _round_features(self, seq) -> tuple[np.ndarray, bool]:
        """What a round reads for ``seq``: its carried hidden, or after an EAGLE round that left it drafted the
        draft's f̂ at its last token (a fork's draft pool holds its parent's: it starts not drafted)."""
        h = self._hidden.get(seq.seq_id)
        if h is not None and h.drafted:
            return h.hidden[1], True
        return self._carried_hidden(seq), False

    # ---- shared --------------------------------------------------------------------------------

    def _speculative_static(self) -> dict:
        return dict(target_config=self.config, proposer_config=self.proposer.config, method=self.proposer.method,
                    attention_impl=self.attention_impl, quant=self.quant, layout=self.layout)

    def _sampling(self, rows, num_seqs: int) -> tuple[SamplingBatch, np.ndarray]:
        cols = sampling_columns(rows, self.buckets.rows(len(rows), num_seqs))
        entry = cols.pop("entry")
        return SamplingBatch(**cols), entry

    def _metadata(self, step: PackedStep) -> AttentionMetadata:
        """The step's attention metadata; checks the multi-token-entry cap the attention relies on."""
        if self.max_chunks is not None and not step.decode_only and step.num_chunks > self.max_chunks:
            # the scheduler keeps this; a bypassing caller would get wrong attention
            raise RuntimeError(f"{step.num_chunks} sequences with more than one token in one step exceed "
                               f"max_num_partial_prefills={self.max_chunks}")
        return AttentionMetadata(slot_mapping=step.slots, block_tables=step.tables, context_lens=step.context,
                                 cu_q_lens=step.cu, decode_only=step.decode_only, max_chunks=self.max_chunks)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write copies in every pool, padded to one size (dst -1 is dropped)."""
        if not copies:
            return
        n = self.buckets.copies(len(copies))
        src, dst = np.zeros(n, np.int32), np.full(n, -1, np.int32)
        src[: len(copies)], dst[: len(copies)] = zip(*copies)
        src, dst = jnp.asarray(src), jnp.asarray(dst)
        self.pool = self._counted(programs.copy_step, self.pool, src, dst)
        if self.draft_pool is not None:
            self.draft_pool = self._counted(programs.copy_step, self.draft_pool, src, dst)

    def _counted(self, fn, *args, **kwargs):
        before = programs.TRACES[0]
        result = fn(*args, **kwargs)
        self.num_compilations += programs.TRACES[0] - before
        return result

