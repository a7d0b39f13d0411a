"""The jit boundary: a scheduled batch -> padded device arrays -> one jitted step -> tokens.

Axis names: T packed tokens, B sequences, M pages per sequence, R sample rows.

Two program families, each over a small set of shape buckets:
- decode: every sequence runs one token; shapes (B, M) with T = B;
- mixed (prefill, chunked prefill, decode together): shapes (T, M) with B = max_num_seqs.
The KV pool is donated to every call, so each layer's pages are updated in place.
The jitted functions live at module level with the model config static, so every runner over
the same config shares its compiled programs. ``num_compilations`` counts the traces (each one
a compile) that this runner's calls caused.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.cache.kv_pool import KVPool, copy_blocks, init_kv_pool
from jaxserve.config import ModelConfig
from jaxserve.engine.buckets import bucket, decode_batch_buckets, powers_of_two
from jaxserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from jaxserve.models.attention import AttentionMetadata, k_tokens_minor, resolve_impl
from jaxserve.models.loading import to_device
from jaxserve.models.transformer import forward
from jaxserve.quant import matmul_context
from jaxserve.sampling import SamplingBatch, sample


@dataclass(frozen=True)
class SampleRow:
    """One token to draw: from the logits of scheduled entry ``entry``; sample number ``index``."""
    entry: int
    index: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    position: int


class ModelRunner:
    def __init__(self, config: ModelConfig, params: dict, *, num_blocks: int, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 attention_impl: str = "auto", quant=None, router_state: dict | None = None,
                 max_num_partial_prefills: int | None = None):
        self.config, self.params = config, to_device(params)  # numpy params would be copied in every step
        # an MoE's loss-free balancing biases: routing state the model reads, never trained here
        self.router_state = None if router_state is None else jax.tree.map(jnp.asarray, router_state)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_chunks = max_num_partial_prefills  # the scheduler's cap on multi-token entries per step
        # Minimum buckets trade a little padded work for far fewer programs to compile.
        self.token_buckets = powers_of_two(min(32, max_num_batched_tokens), max_num_batched_tokens)
        max_pages = -(-max_model_len // block_size)
        if resolve_impl(attention_impl) == "xla":
            # The XLA path loops over live pages only: its cost does not follow the table width,
            # so one width (the longest table) serves every step; with that many fewer programs,
            # decode batches can afford half-octave buckets (a draining batch of 33 runs as 48, not 64)
            # and small ones (1, 2, 4) for low-load latency.
            self.page_buckets = [max_pages]
            self.seq_buckets = decode_batch_buckets(max_num_seqs)
        else:
            self.page_buckets = powers_of_two(min(max(1, 128 // block_size), max_pages), max_pages)
            self.seq_buckets = powers_of_two(min(8, max_num_seqs), max_num_seqs)
        self.pool: KVPool = init_kv_pool(config.num_layers, num_blocks, block_size, config.num_kv_heads,
                                         config.head_dim, jnp.dtype(config.dtype),
                                         k_tokens_minor=k_tokens_minor(attention_impl))
        self.attention_impl = attention_impl
        self.quant = quant  # jaxserve.quant.MatmulSettings when params hold QuantizedTensors
        self.num_compilations = 0

    @property
    def num_buckets(self) -> int:
        """Upper bound on distinct step programs (plus copy programs)."""
        pages = len(self.page_buckets)
        return pages * (len(self.seq_buckets) + len(self.token_buckets)) + 1

    def _counted(self, fn, *args, **kwargs):
        before = _TRACES[0]
        result = fn(*args, **kwargs)
        self.num_compilations += _TRACES[0] - before
        return result

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        n = bucket(len(copies), powers_of_two(self.max_num_seqs, len(copies)))  # one size in practice
        src = np.zeros(n, np.int32)
        dst = np.full(n, -1, np.int32)
        src[: len(copies)], dst[: len(copies)] = zip(*copies)
        self.pool = self._counted(_copy, self.pool, jnp.asarray(src), jnp.asarray(dst))

    def execute(self, out: SchedulerOutput, rows: list[SampleRow], top_logprobs: bool = False
                ) -> tuple[np.ndarray, ...]:
        """Runs one scheduled step. Returns, for each row: the drawn token i32[R], its log-prob f32[R],
        and (only with ``top_logprobs``, else zeros) the NUM_TOP_LOGPROBS most likely tokens'
        log-probs f32[R, k] and ids i32[R, k]."""
        self.copy_blocks(out.copies)
        entries = out.scheduled
        decode_only = all(len(e.token_ids) == 1 for e in entries)
        num_pages = bucket(max(len(e.block_table) for e in entries), self.page_buckets)
        if decode_only:
            num_seqs = bucket(len(entries), self.seq_buckets)
            num_tokens = num_seqs
        else:
            num_seqs = self.max_num_seqs
            num_tokens = bucket(out.num_batched_tokens, self.token_buckets)
        return self._run(_pack(entries, num_tokens, num_seqs, num_pages), rows, decode_only, top_logprobs)

    def _run(self, arrays: dict, rows: list[SampleRow], decode_only: bool, top_logprobs: bool = False
             ) -> tuple[np.ndarray, ...]:
        meta = self.metadata(arrays, decode_only)
        num_seqs = arrays["tables"].shape[0]
        num_rows = bucket(len(rows), powers_of_two(num_seqs, len(rows)))  # = num_seqs unless n>1 forks overflow
        sbatch, sample_entry = _sampling_arrays(rows, num_rows)
        results, self.pool = self._counted(
            _step, self.params, self.pool, arrays["tokens"], arrays["positions"], meta, arrays["last"],
            sample_entry, sbatch, np.bool_(top_logprobs), self.router_state, config=self.config,
            attention_impl=self.attention_impl, quant=self.quant)
        return tuple(r[: len(rows)] for r in jax.device_get(results))

    def metadata(self, arrays: dict, decode_only: bool = False) -> AttentionMetadata:
        """The step's attention metadata; checks the multi-token-entry cap the attention relies on."""
        if self.max_chunks is not None and not decode_only:
            chunks = int(np.count_nonzero(np.diff(arrays["cu"]) > 1))
            if chunks > self.max_chunks:  # the scheduler keeps this; a bypassing caller would get wrong attention
                raise RuntimeError(f"{chunks} sequences with more than one token in one step exceed "
                                   f"max_num_partial_prefills={self.max_chunks}")
        return AttentionMetadata(slot_mapping=arrays["slots"], block_tables=arrays["tables"],
                                 context_lens=arrays["context"], cu_q_lens=arrays["cu"], decode_only=decode_only,
                                 max_chunks=self.max_chunks)

    def warmup(self) -> int:
        """Compiles and runs every bucket's program once (the pool is not written).

        Returns the number of programs compiled; afterwards a workload compiles nothing new.
        Each batch holds one token that attends to one cached slot and writes nowhere: with no
        live token at all, the attention loops would run zero times and their first real run
        would still pay ~30 ms of one-off cost in the middle of serving.
        """
        before = self.num_compilations
        shapes = [(b, b, m, True) for b in self.seq_buckets for m in self.page_buckets]
        shapes += [(t, self.max_num_seqs, m, False) for t in self.token_buckets for m in self.page_buckets]
        for num_tokens, num_seqs, num_pages, decode_only in shapes:
            self._run(_pack([WARMUP_READER], num_tokens, num_seqs, num_pages), [], decode_only)
        self.copy_blocks([(0, 0)])  # a self-copy: harmless
        return self.num_compilations - before


_TRACES = [0]  # incremented while tracing: one per compiled program
# Warm-up's one token: position 0, attending to one cached slot, written nowhere (slot -1).
WARMUP_READER = ScheduledSequence(seq_id=-1, request_id="", index=0, token_ids=[0], start_pos=0, block_table=[0],
                                  slot_mapping=[-1], sample=False, num_samples=0, sampling_params=None)
NUM_TOP_LOGPROBS = 16  # top candidates returned per sample row (beam search uses 2 x beam_width)


@functools.partial(jax.jit, static_argnames=("config", "attention_impl", "quant"), donate_argnames=("kv_pool",))
def _step(params, kv_pool, tokens, positions, meta, logits_indices, sample_entry, sbatch, want_top, router_state=None,
          *, config, attention_impl, quant=None):
    _TRACES[0] += 1
    # quant is static: a quantized tree looks the same under every matmul setting
    with matmul_context(quant):
        logits, kv_pool = forward(params, config, tokens, positions, kv_pool, meta,
                                  attention_impl=attention_impl, logits_indices=logits_indices,
                                  router_state=router_state)
    logits = logits[sample_entry]
    toks, logprobs = sample(logits, sbatch)
    k = min(NUM_TOP_LOGPROBS, logits.shape[-1])
    # a runtime branch, not a static flag (which would double the programs): only beam search
    # asks, and at batch 64 x 4096 the top-k costs ~1 ms of a ~20 ms CPU decode step
    top_logprobs, top_ids = jax.lax.cond(
        want_top, lambda: tuple(jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), k)),
        lambda: (jnp.zeros((logits.shape[0], k), jnp.float32), jnp.zeros((logits.shape[0], k), jnp.int32)))
    return (toks, logprobs, top_logprobs, top_ids), kv_pool


@functools.partial(jax.jit, donate_argnames=("kv_pool",))
def _copy(kv_pool, src, dst):
    _TRACES[0] += 1
    return copy_blocks(kv_pool, src, dst)


def _pack(entries, num_tokens: int, num_seqs: int, num_pages: int) -> dict[str, np.ndarray]:
    tokens = np.zeros(num_tokens, np.int32)
    positions = np.zeros(num_tokens, np.int32)
    slots = np.full(num_tokens, -1, np.int32)
    tables = np.zeros((num_seqs, num_pages), np.int32)
    context = np.zeros(num_seqs, np.int32)
    cu = np.zeros(num_seqs + 1, np.int32)
    last = np.zeros(num_seqs, np.int32)
    t = 0
    for b, e in enumerate(entries):
        n = len(e.token_ids)
        tokens[t:t + n] = e.token_ids
        positions[t:t + n] = np.arange(e.start_pos, e.start_pos + n)
        slots[t:t + n] = e.slot_mapping
        tables[b, : len(e.block_table)] = e.block_table
        context[b] = e.start_pos + n
        t += n
        cu[b + 1] = t
        last[b] = t - 1
    cu[len(entries) + 1:] = t
    # numpy, not jax, arrays: jit's C++ path transfers numpy arguments itself, while one
    # jnp.asarray per array costs ~40 us of Python each (~0.5 ms a step for the 14 step inputs)
    return dict(tokens=tokens, positions=positions, slots=slots, tables=tables, context=context, cu=cu, last=last)


def _sampling_arrays(rows: list[SampleRow], num_rows: int) -> tuple[SamplingBatch, np.ndarray]:
    def col(name, dtype, fill):
        a = np.full(num_rows, fill, dtype)
        a[: len(rows)] = [getattr(r, name) for r in rows]
        return a  # numpy: see _pack

    sbatch = SamplingBatch(temperature=col("temperature", np.float32, 0.0), top_k=col("top_k", np.int32, 0),
                           top_p=col("top_p", np.float32, 1.0), seed=col("seed", np.uint32, 0),
                           index=col("index", np.int32, 0), position=col("position", np.int32, 0))
    return sbatch, col("entry", np.int32, 0)
