"""What crosses the jit boundary, on the host side (no JAX): a scheduled step packed into padded
arrays, the bucket policy that picks the padded shapes, the sample rows, and ``RunnerOutput``.

Axis names: T packed tokens, B sequences, M pages per sequence, R sample rows.

Program families and their buckets (every runner step is one of them):
- decode: every sequence runs one token; shapes (B, M) with T = B;
- mixed (prefill, chunked prefill, decode together; also every speculative fill): (T, M) with
  B = max_num_seqs;
- speculative round: one round for B decoding sequences, (B, M) with M covering γ lookahead slots.
Padded arrays are numpy, not jax: jit's C++ path transfers numpy arguments itself, while one
``jnp.asarray`` per array costs ~40 us of Python each (~0.5 ms a step for the 14 step inputs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jaxserve.buckets import bucket, decode_batch_buckets, powers_of_two
from jaxserve.sampling_params import MAX_TOP_LOGPROBS

# top candidates returned per sample row when asked (beam search uses 2 x beam_width; SamplingParams.top_logprobs)
NUM_TOP_LOGPROBS = MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class SampleRow:
    """One token to draw: from the logits of packed entry ``entry``; sample number ``index``."""
    entry: int
    index: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    position: int


def sample_rows(entries) -> list[SampleRow]:
    """The draws of a step: ``num_samples`` per entry that samples, in entry order."""
    rows = []
    for i, e in enumerate(entries):
        if e.sample:
            sp = e.sampling_params
            rows += [SampleRow(i, e.index + j, sp.temperature, sp.top_k, sp.top_p, e.seed, e.context_len)
                     for j in range(e.num_samples)]
    return rows


def sampling_columns(rows: list[SampleRow], num_rows: int) -> dict[str, np.ndarray]:
    """Rows as padded columns (``jaxserve.sampling.SamplingBatch``'s fields, plus ``entry``)."""
    def col(name, dtype, fill):
        a = np.full(num_rows, fill, dtype)
        a[: len(rows)] = [getattr(r, name) for r in rows]
        return a

    return dict(temperature=col("temperature", np.float32, 0.0), top_k=col("top_k", np.int32, 0),
                top_p=col("top_p", np.float32, 1.0), seed=col("seed", np.uint32, 0),
                index=col("index", np.int32, 0), position=col("position", np.int32, 0),
                entry=col("entry", np.int32, 0))


@dataclass(frozen=True)
class PackedStep:
    tokens: np.ndarray  # i32[T]
    positions: np.ndarray  # i32[T]
    slots: np.ndarray  # i32[T]: flat pool slot of each token; -1 = padding (written nowhere)
    tables: np.ndarray  # i32[B, M]
    context: np.ndarray  # i32[B]: cached + new tokens after the step
    cu: np.ndarray  # i32[B+1]: entry b owns packed rows cu[b]:cu[b+1]
    last: np.ndarray  # i32[B]: each entry's last packed row (where its logits are read)
    decode_only: bool

    @property
    def num_chunks(self) -> int:
        """Entries with more than one token."""
        return int(np.count_nonzero(np.diff(self.cu) > 1))


def pack(entries, num_tokens: int, num_seqs: int, num_pages: int, decode_only: bool = False) -> PackedStep:
    """Scheduled entries (``ScheduledSequence``s, in order) packed into arrays of the given padded sizes."""
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
    return PackedStep(tokens, positions, slots, tables, context, cu, last, decode_only)


class BucketPolicy:
    """The padded shapes of every program a runner compiles; ``num_programs`` bounds them.

    ``live_pages_only``: the attention's cost follows live pages, not the table width (the XLA
    path), so one table width (the longest) serves every step; with that many fewer programs,
    decode batches can afford half-octave buckets (a draining batch of 33 runs as 48, not 64).
    Either way decode batches have small buckets (1, 2, 4) for low-load latency. ``lookahead``: γ of a speculative runner.
    ``narrow_rounds``: its drafts are made on the host (suffix decoding), so a round can verify only as many
    slots as its longest draft: ``round_widths`` are γ and every half of it down to 1 (γ 16: 1, 2, 4, 8, 16),
    so a round with short drafts costs a short verify (most host drafts are 0-4 tokens; one of 5 verifies 8
    slots, not 16), at most 5 programs per round shape for γ <= 16.
    """

    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, block_size: int,
                 live_pages_only: bool, lookahead: int = 0, narrow_rounds: bool = False):
        self.max_num_seqs = max_num_seqs
        self.lookahead = lookahead
        self.round_widths = [lookahead]
        while narrow_rounds and self.round_widths[0] >= 2:
            self.round_widths.insert(0, self.round_widths[0] // 2)
        # Minimum buckets trade a little padded work for far fewer programs to compile.
        self.token_buckets = powers_of_two(min(32, max_num_batched_tokens), max_num_batched_tokens)
        self.page_buckets = self._pages(-(-max_model_len // block_size), block_size, live_pages_only)
        if live_pages_only:
            self.seq_buckets = decode_batch_buckets(max_num_seqs)
        else:  # 1, 2 and 4 too: a lone request in an 8-row program paid for 8 rows of every matmul (SmolLM2 W4A8 at
            # batch 1 on CPU: its VNNI kernels decode weights once per 4 rows, the int8 head reads itself per 2)
            self.seq_buckets = [b for b in (1, 2, 4) if b < min(8, max_num_seqs)] + powers_of_two(
                min(8, max_num_seqs), max_num_seqs)
        # a round's table reaches γ slots past the last token; 1 and 2 rows too: speculation pays at low load
        self.round_page_buckets = self._pages(-(-(max_model_len + lookahead) // block_size), block_size,
                                              live_pages_only)
        self.round_seq_buckets = powers_of_two(1, max_num_seqs)

    @staticmethod
    def _pages(max_pages: int, block_size: int, live_pages_only: bool) -> list[int]:
        if live_pages_only:
            return [max_pages]
        return powers_of_two(min(max(1, 128 // block_size), max_pages), max_pages)

    def step(self, entries, num_batched_tokens: int, *, allow_decode: bool = True) -> tuple[int, int, int, bool]:
        """(T, B, M, decode_only) of a decode or mixed step over ``entries`` (mixed only, without
        ``allow_decode``: a speculative fill)."""
        num_pages = bucket(max(len(e.block_table) for e in entries), self.page_buckets)
        if allow_decode and all(len(e.token_ids) == 1 for e in entries):
            num_seqs = bucket(len(entries), self.seq_buckets)
            return num_seqs, num_seqs, num_pages, True
        return bucket(num_batched_tokens, self.token_buckets), self.max_num_seqs, num_pages, False

    def round(self, entries) -> tuple[int, int]:
        """(B, M) of a speculative round over ``entries``."""
        return (bucket(len(entries), self.round_seq_buckets),
                bucket(max(len(e.block_table) for e in entries), self.round_page_buckets))

    def round_width(self, longest_draft: int) -> int:
        """Draft slots of a round whose longest host draft is ``longest_draft`` tokens (``narrow_rounds``)."""
        return bucket(max(longest_draft, 1), self.round_widths)

    def rows(self, num_rows: int, num_seqs: int) -> int:
        """Padded sample rows: ``num_seqs`` unless n>1 forks overflow it."""
        return bucket(num_rows, powers_of_two(num_seqs, num_rows))

    def copies(self, num_copies: int) -> int:
        """Padded block-copy pairs: one size in practice."""
        return bucket(num_copies, powers_of_two(self.max_num_seqs, num_copies))

    def decode_shapes(self) -> list[tuple[int, int, int, bool]]:
        return [(b, b, m, True) for b in self.seq_buckets for m in self.page_buckets]

    def mixed_shapes(self) -> list[tuple[int, int, int, bool]]:
        return [(t, self.max_num_seqs, m, False) for t in self.token_buckets for m in self.page_buckets]

    def round_shapes(self) -> list[tuple[int, int]]:
        return [(b, m) for b in self.round_seq_buckets for m in self.round_page_buckets]

    def num_programs(self, speculative: bool) -> int:
        """Upper bound on the step programs (plus the block copy) a runner compiles."""
        if speculative:  # fill (mixed shapes) and rounds
            return len(self.mixed_shapes()) + len(self.round_shapes()) * len(self.round_widths) + 1
        return len(self.decode_shapes()) + len(self.mixed_shapes()) + 1


@dataclass
class RunnerOutput:
    """What one ``ModelRunner.execute`` produced.

    ``sampled``: what ``Scheduler.update`` takes, per sequence id: a token; the ``num_samples``
    first tokens of an n>1 fork; or a speculative round's 1..γ+1 emitted tokens (a list).
    ``logprobs``: per (request id, sample index), the new tokens' log-probabilities under the
    target's raw logits, in order (a round's may run past a stop the scheduler cuts at).
    ``top``: only when asked (beam search, ``SamplingParams.top_logprobs``), per sequence id, the NUM_TOP_LOGPROBS most likely next
    tokens' log-probs f32[k] and ids i32[k]. ``accepted``: per sequence id that ran a round, the
    draft tokens accepted; ``drafted``: the tokens it proposed, when fewer than γ can be (suffix
    decoding); ``target_rows``: target positions sampled or verified (metrics).
    """
    sampled: dict[int, int | list[int]] = field(default_factory=dict)
    logprobs: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    top: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    drafted: dict[int, int] = field(default_factory=dict)
    target_rows: int = 0

    def merge(self, other: RunnerOutput) -> RunnerOutput:
        self.sampled.update(other.sampled)
        self.logprobs.update(other.logprobs)
        self.top.update(other.top)
        self.accepted.update(other.accepted)
        self.drafted.update(other.drafted)
        self.target_rows += other.target_rows
        return self


def collect_samples(entries, rows: int, toks: np.ndarray, lps: np.ndarray) -> RunnerOutput:
    """Per-row draws (in ``sample_rows`` order) -> ``RunnerOutput`` keyed by sequence and request."""
    out, k = RunnerOutput(target_rows=rows), 0
    for e in entries:
        if e.sample:
            drawn = [int(t) for t in toks[k:k + e.num_samples]]
            out.sampled[e.seq_id] = drawn if e.num_samples > 1 else drawn[0]
            for j in range(e.num_samples):
                out.logprobs[(e.request_id, e.index + j)] = [float(lps[k + j])]
            k += e.num_samples
    return out
