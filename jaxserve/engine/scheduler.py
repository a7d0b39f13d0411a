"""Continuous-batching scheduler (host, no JAX): which tokens of which sequences run next.

Iteration-level scheduling in the style of vLLM v1. Every sequence has ``num_tokens`` (prompt
+ outputs) and ``num_computed_tokens``; each ``schedule()`` hands out up to
``max_num_batched_tokens`` tokens, running sequences first (oldest first: decodes take one
token, unfinished prefills a chunk), then waiting ones (preempted first, then by arrival)
while ``max_num_seqs``, the token budget and free blocks allow. A long prompt is split over
steps (chunked prefill); at most ``max_num_partial_prefills`` sequences run more than one token
in a step (vLLM's knob of that name), which bounds the attention tiles a mixed step needs (see
``ragged_paged_attention_online``). When a running sequence needs a block and none is free, the newest
running sequence is preempted: its blocks are freed and it goes back to the front of the
queue, to be recomputed from prompt + outputs (prefix-cache hits make that cheap).

Admission beyond free blocks is pluggable (``Admission``): paged serving admits whatever the
blocks allow (``AdmitAll``); the vLLM paper's Orca baselines (``ContiguousReservations``) admit a
request only once its contiguous reservation fits, held until it ends. Blocks are still taken on
demand from the paged pool, which the engine then sizes so that the reservations, not the blocks,
are the binding limit.

Driving loop (the engine)::

    sched.add_request("r0", prompt_ids, params)       # ValueError if it can never run
    while sched.has_unfinished():
        out = sched.schedule()                        # SchedulerOutput
        # device: pool[dst] = pool[src] for out.copies, then one step over out.scheduled,
        # returning logits for the entries with sample=True (num_samples draws each)
        res = sched.update(out, {s.seq_id: token(s) for s in out.scheduled if s.sample})
        # res.new_token_ids: seq_id -> token (children of an n>1 fork included)
        # res.finished: Requests that completed this step (blocks already freed)

``update`` accepts for each sampled entry an ``int`` or, when ``num_samples > 1`` (the step
that ends an n>1 request's prefill), a sequence of ``num_samples`` ints: sample 0 continues
the sequence, sample j goes to a new child sharing its blocks (``Sequence.index == j``).

Speculative decoding (``num_lookahead_slots`` = γ > 0, as vLLM's num_lookahead_slots): a decode
entry that the token budget allows γ more tokens gets ``num_lookahead = γ`` and slots for
positions up to ``start_pos + γ``; ``update`` then takes the round's 1..γ+1 emitted tokens as a
list (accepted drafts, whose K/V the round wrote, then the target's token), stops at the first
finishing token, and gives the unused lookahead slots back (rollback is lengths only). A
``speculation_policy`` (``jaxserve.engine.spec_policy``) may withhold the slots for a whole step
(every decode then runs plain): it is asked once per step with the number of decoding sequences and
of running ones (prefilling too).

Multi-step decoding (``num_scheduler_steps`` = K > 1, vLLM's knob of that name): a step in which every running
sequence decodes and no waiting one could take a seat runs K decode steps in one device program, so the
dispatch and this scheduler's work are paid once per K tokens. Each decode gets ``num_lookahead`` = up to K - 1
slots (fewer when it has fewer tokens left; none when the pool is short, never a preemption for them) and
``update`` takes its 1..K tokens as a round's (each after the first follows one whose K/V the step wrote), cut
at the first that finishes it. The lookahead is not charged to the token budget: each of the K passes runs one
token per sequence. A step with a prefill, or waiting work that could be admitted, runs one step as before.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence as Seq

from jaxserve.cache.block_manager import BlockManager, NoFreeBlocksError, table_slots
from jaxserve.engine.sequence import Request, Sequence, SequenceStatus


class Admission(Protocol):
    """Whether a request may join the running batch, beyond what free blocks allow."""

    def check(self, who: str, final_len: int, n: int) -> None:
        """``ValueError`` naming ``who`` if a request of ``final_len`` tokens x ``n`` samples can never run."""

    def try_admit(self, request_id: str, final_len: int, n: int) -> bool:
        """Admits (idempotently) or refuses for now."""

    def release(self, request_id: str) -> None:
        """The request ended."""


class AdmitAll:
    """Paged serving (vLLM): blocks on demand, nothing reserved."""

    def check(self, who: str, final_len: int, n: int) -> None:
        pass

    def try_admit(self, request_id: str, final_len: int, n: int) -> bool:
        return True

    def release(self, request_id: str) -> None:
        pass


@dataclass(slots=True)  # read-only by convention; frozen=True costs ~3 us per entry per step
class ScheduledSequence:
    """One sequence's work in a step. Positions are ``start_pos + arange(len(token_ids))``."""
    seq_id: int
    request_id: str
    index: int  # sample number within the request (per-sample RNG streams)
    token_ids: list[int]  # tokens to run this step
    start_pos: int  # == num_computed_tokens before the step
    block_table: list[int]  # physical blocks covering positions [0, start_pos + len(token_ids))
    slot_mapping: list[int]  # flat KV slot of each token in token_ids
    sample: bool  # sample a token from the last position's logits after this step
    num_samples: int  # tokens to draw when sample (n at the end of an n>1 prefill, else 1)
    sampling_params: Any
    # slots past token_ids (block_table covers them): a speculative round's γ, or a multi-step decode's further
    # steps; 0: one plain step
    num_lookahead: int = 0
    seed: int = 0  # the request's RNG seed (per-sample streams come from seed, index and position)
    seq: Sequence | None = None  # the sequence itself: speculative rounds read its history

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence]
    copies: list[tuple[int, int]]  # (src, dst) KV block copies to perform before the step
    preempted: list[int]  # seq ids preempted (blocks freed) while scheduling this step
    num_batched_tokens: int  # sum of len(token_ids)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class UpdateResult:
    new_token_ids: dict[int, int] = field(default_factory=dict)  # seq_id -> token appended
    finished: list[Request] = field(default_factory=list)


class Scheduler:
    """Owns the waiting queue and running list; drives a ``BlockManager``."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 admission: Admission | None = None,
                 eos_token_id: int | None = None, enable_chunked_prefill: bool = True,
                 num_lookahead_slots: int = 0, max_num_partial_prefills: int | None = None,
                 speculation_policy: Any = None, num_scheduler_steps: int = 1):
        if num_scheduler_steps < 1:
            raise ValueError(f"num_scheduler_steps={num_scheduler_steps} must be >= 1")
        if num_scheduler_steps > 1 and num_lookahead_slots:
            raise ValueError(f"num_scheduler_steps={num_scheduler_steps} and num_lookahead_slots="
                             f"{num_lookahead_slots} (speculative decoding) cannot be combined")
        if min(max_num_seqs, max_num_batched_tokens, max_model_len) < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}, max_num_batched_tokens="
                             f"{max_num_batched_tokens}, max_model_len={max_model_len} must be >= 1")
        if max_num_partial_prefills is not None and max_num_partial_prefills < 1:
            raise ValueError(f"max_num_partial_prefills={max_num_partial_prefills} must be >= 1 (or None: no cap)")
        if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(f"without chunked prefill max_num_batched_tokens="
                             f"{max_num_batched_tokens} must be >= max_model_len={max_model_len}")
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.enable_chunked_prefill = enable_chunked_prefill
        self.admission = admission or AdmitAll()
        self.num_lookahead_slots = num_lookahead_slots
        self.policy = speculation_policy  # .speculate(num_decodes, num_running) -> bool; None: always
        self._speculate = True  # this step's decision
        self.num_scheduler_steps = num_scheduler_steps
        self.max_num_partial_prefills = max_num_partial_prefills or max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Request] = {}  # unfinished only
        self.seqs: dict[int, Sequence] = {}  # unfinished only
        self.num_preemptions = 0
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self._last_output: SchedulerOutput | None = None

    # ---- requests ------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: Seq[int], sampling_params: Any,
                    seed: int = 0) -> Request:
        """Queues a request; raises ``ValueError`` (no state change) if it can never run."""
        self._validate(request_id, prompt_token_ids, sampling_params)
        req = Request(request_id, prompt_token_ids, sampling_params, next(self._arrivals), seed)
        seq = Sequence(next(self._seq_ids), req, 0)
        req.seqs.append(seq)
        self.seqs[seq.seq_id] = seq
        self.requests[request_id] = req
        self.waiting.append(seq)
        return req

    def validate_request(self, request_id: str | None, prompt_token_ids: Seq[int],
                         sampling_params: Any, label: str | None = None) -> None:
        """The checks of ``add_request``, queuing nothing: ``ValueError`` if it can never run.

        ``request_id`` None skips the duplicate check; ``label`` names the request in messages
        (default ``request '<id>'``)."""
        self._validate(request_id, prompt_token_ids, sampling_params, label)

    def abort(self, request_id: str) -> Request:
        """Stops a request now and frees all its blocks; unknown (or finished) id: ValueError."""
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"unknown request id {request_id!r}")
        for seq in req.seqs:
            if not seq.is_finished:
                self._finish(seq, SequenceStatus.FINISHED_ABORTED)
        del self.requests[request_id]
        self._release(req)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> Request:
        try:
            return self.requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request id {request_id!r}") from None

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        copies: list[tuple[int, int]] = []
        preempted: list[int] = []

        chunks = 0  # entries with more than one token (prefill chunks, recomputes)
        if self.num_lookahead_slots and self.policy is not None:
            decodes = sum(self._is_decode(s) for s in self.running)
            self._speculate = not decodes or self.policy.speculate(decodes, len(self.running))
        multi_step = self._multi_step()
        i = 0
        while i < len(self.running) and budget > 0 and len(scheduled) < self.max_num_seqs:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 1 and chunks == self.max_num_partial_prefills:
                i += 1  # its chunk waits a step; the decodes behind it still run
                continue
            chunks += n > 1
            if multi_step:
                look, cow = self._steps_ahead(seq)
                cow = cow if look else self._append_or_preempt(seq, n, preempted)
            else:
                look = self._lookahead(seq, n, budget)
                cow = self._append_or_preempt(seq, n + look, preempted)
            if cow is None:  # seq preempted itself: nothing newer is left to schedule
                break
            copies += cow
            scheduled.append((seq, n, look))
            budget -= n + (0 if multi_step else look)
            i += 1

        # Admitting new work right after a preemption would just thrash (unless nothing runs).
        if not preempted or not scheduled:
            reserved = sum(self._seats(s) for s in self.running)
            while self.waiting and budget > 0 and chunks < self.max_num_partial_prefills:
                seq = self.waiting[0]
                if reserved + self._seats(seq) > self.max_num_seqs:
                    break
                n = self._admit(seq, budget)
                if n is None:
                    break
                self.waiting.popleft()
                copies += self.bm.append_slots(seq.seq_id, n)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                scheduled.append((seq, n, 0))
                budget -= n
                reserved += self._seats(seq)
                chunks += n > 1

        out = SchedulerOutput([self._entry(s, n, look) for s, n, look in scheduled], copies, preempted,
                              self.max_num_batched_tokens - budget)
        self._last_output = out
        return out

    def update(self, output: SchedulerOutput,
               sampled_token_ids: Mapping[int, int | Seq[int]]) -> UpdateResult:
        """Advances the sequences run by ``output`` and appends their sampled tokens.

        Checks stop conditions (EOS unless ``ignore_eos``, ``stop_token_ids``, ``max_tokens``,
        ``max_model_len``), frees finished sequences' blocks, and returns the new tokens and
        the requests that finished.
        """
        if output is not self._last_output:
            raise ValueError("update() must be given the output of the latest schedule()")
        samples = self._check_samples(output, sampled_token_ids)  # raises before any change
        self._last_output = None
        res, bs = UpdateResult(), self.bm.block_size
        done: dict[str, Request] = {}  # requests with a sequence that finished this step
        for entry in output.scheduled:
            seq = self.seqs.get(entry.seq_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue  # aborted between schedule() and update()
            seq.num_computed_tokens += len(entry.token_ids)
            if entry.num_lookahead:
                if self._append_round(seq, samples[entry.seq_id], res):
                    done[seq.request_id] = seq.request
                continue
            if seq.num_computed_tokens // bs > entry.start_pos // bs:  # a block just filled up
                self.bm.cache_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens)
            if not entry.sample:
                continue
            tokens = samples[entry.seq_id]
            for s, tok in zip(self._fork_samples(seq, len(tokens)), tokens):
                if self._append_token(s, tok, res):
                    done[s.request_id] = s.request
        for req in done.values():
            if req.is_finished and req.request_id in self.requests:
                res.finished.append(req)
                del self.requests[req.request_id]
                self._release(req)
        return res

    # ---- sharing helpers for beam search -------------------------------------------------

    def fork_sequence(self, seq_id: int) -> Sequence:
        """New running sibling of a running, fully computed sequence, sharing its blocks."""
        seq = self.seqs.get(seq_id)
        if seq is None or seq.status is not SequenceStatus.RUNNING:
            raise ValueError(f"sequence {seq_id} is not running")
        child = Sequence(next(self._seq_ids), seq.request, len(seq.request.seqs),
                         seq.output_token_ids)
        child.num_computed_tokens = seq.num_computed_tokens
        child.status = SequenceStatus.RUNNING
        self.bm.fork(seq.seq_id, child.seq_id)
        seq.request.seqs.append(child)
        self.seqs[child.seq_id] = child
        self.running.insert(self.running.index(seq) + 1, child)
        return child

    def drop_sequence(self, seq_id: int) -> None:
        """Ends one running sequence of a request and frees its blocks (beam pruning)."""
        seq = self.seqs.get(seq_id)
        if seq is None or seq.status is not SequenceStatus.RUNNING:
            raise ValueError(f"sequence {seq_id} is not running")
        self._finish(seq, SequenceStatus.FINISHED_ABORTED)

    def stats(self) -> dict[str, Any]:
        s = self.bm.stats()
        return {"num_waiting": len(self.waiting), "num_running": len(self.running),
                "num_preemptions": self.num_preemptions, "kv_blocks_total": s.num_blocks,
                "kv_blocks_used": s.num_used, "kv_blocks_free": s.num_free,
                "kv_blocks_cached": s.num_cached, "prefix_cache_hit_rate": s.prefix_hit_rate}

    # ---- internals -----------------------------------------------------------------------

    def _validate(self, request_id, prompt_token_ids, params, label=None) -> None:
        if request_id is not None and request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        who = label or f"request {request_id!r}"
        p = len(prompt_token_ids)
        if p == 0:
            raise ValueError(f"{who}: empty prompt")
        if p > self.max_model_len:
            raise ValueError(f"{who}: prompt of {p} tokens is longer than "
                             f"max_model_len={self.max_model_len}")
        max_tokens, n = params.max_tokens, getattr(params, "n", 1)
        if max_tokens is None:  # as in vLLM: until max_model_len
            max_tokens = max(self.max_model_len - p, 1)
        if max_tokens < 1 or n < 1:
            raise ValueError(f"{who}: max_tokens={max_tokens} and n={n} must be >= 1")
        if n > self.max_num_seqs:
            raise ValueError(f"{who}: n={n} exceeds max_num_seqs={self.max_num_seqs}")
        # The last token is sampled, never run, so a sequence needs (final length - 1) slots.
        final_len = min(p + max_tokens, max(self.max_model_len, p + 1))
        blocks = self.bm.blocks_for(final_len - 1 + self.num_lookahead_slots)
        if blocks > self.bm.num_blocks:
            raise ValueError(f"{who}: {p} prompt + up to {final_len - p} output "
                             f"tokens need {blocks} KV blocks of {self.bm.block_size}, but the "
                             f"pool has only {self.bm.num_blocks}")
        self.admission.check(who, final_len, n)

    @staticmethod
    def _check_samples(output: SchedulerOutput, sampled) -> dict[int, list[int]]:
        samples = {}
        for e in output.scheduled:
            if not e.sample:
                continue
            if e.seq_id not in sampled:
                raise ValueError(f"no sampled token for sequence {e.seq_id}")
            t = sampled[e.seq_id]
            tokens = [int(x) for x in t] if hasattr(t, "__len__") else [int(t)]
            if e.num_lookahead and 1 <= len(tokens) <= e.num_lookahead + 1:
                pass  # a speculative round's emitted tokens
            elif len(tokens) != e.num_samples:
                raise ValueError(f"sequence {e.seq_id} needs {e.num_samples} sampled tokens, "
                                 f"got {len(tokens)}")
            samples[e.seq_id] = tokens
        return samples

    def _final_len(self, req: Request) -> int:
        """Tokens (prompt + outputs) a request ends with if no stop token comes first."""
        p, max_tokens = len(req.prompt_token_ids), req.sampling_params.max_tokens
        if max_tokens is None:
            max_tokens = max(self.max_model_len - p, 1)
        return min(p + max_tokens, max(self.max_model_len, p + 1))

    def _release(self, req: Request) -> None:
        self.admission.release(req.request_id)

    def _seats(self, seq: Sequence) -> int:
        """Batch seats a sequence will take: an unforked n>1 request reserves all n."""
        return 1 if seq.request.forked or seq.index else seq.request.n

    def _lookahead(self, seq: Sequence, n: int, budget: int) -> int:
        """Speculative slots for a decode (a sequence with outputs, one token left) if the budget allows, and
        if it may emit more than one token (at its last a round's drafts would all be cut: a plain decode)."""
        k = self.num_lookahead_slots if self._speculate else 0
        decode = n == 1 and self._is_decode(seq) and self._final_len(seq.request) - seq.num_tokens > 1
        return k if k and decode and budget >= n + k else 0

    def _multi_step(self) -> bool:
        """Whether this step runs ``num_scheduler_steps`` decode steps: every running sequence decodes, and the
        first waiting one (if any) has no seat to take (new work is never held back by a multi-step)."""
        if self.num_scheduler_steps == 1 or not self.running or not all(map(self._is_decode, self.running)):
            return False
        if not self.waiting:
            return True
        return sum(map(self._seats, self.running)) + self._seats(self.waiting[0]) > self.max_num_seqs

    def _steps_ahead(self, seq: Sequence) -> tuple[int, list[tuple[int, int]]]:
        """A multi-step decode's lookahead (its further steps, up to K - 1, one fewer than the tokens it has
        left) and the copies taking slots for them cost; (0, []) with nothing taken if the pool is short."""
        look = min(self.num_scheduler_steps - 1, self._final_len(seq.request) - seq.num_tokens - 1)
        if look <= 0:
            return 0, []
        try:
            return look, self.bm.append_slots(seq.seq_id, 1 + look)
        except NoFreeBlocksError:
            return 0, []

    @staticmethod
    def _is_decode(seq: Sequence) -> bool:
        """One token left to run and outputs already (a prefill's last chunk never speculates)."""
        return seq.num_uncomputed_tokens == 1 and bool(seq.output_token_ids)

    def _append_or_preempt(self, seq: Sequence, n: int, preempted: list[int]):
        """Slots for ``n`` tokens of ``seq``, preempting the newest running sequences if needed.

        Returns the COW copies, or None if ``seq`` itself had to be preempted.
        """
        while True:
            try:
                return self.bm.append_slots(seq.seq_id, n)
            except NoFreeBlocksError:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.seq_id)
                if victim is seq:
                    return None

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Allocates a waiting sequence with its prefix hits; returns tokens to run, or None."""
        tokens = seq.token_ids
        cached = self.bm.num_cached_tokens(tokens)
        n = min(len(tokens) - cached, budget)
        if n < len(tokens) - cached and not self.enable_chunked_prefill:
            return None
        if not self.bm.can_allocate(tokens, n):
            return None
        # The reservation assumes the full length (an oracle's guess is exact under ignore_eos).
        if not self.admission.try_admit(seq.request_id, self._final_len(seq.request), seq.request.n):
            return None
        seq.num_computed_tokens = self.bm.allocate(seq.seq_id, tokens)
        assert seq.num_computed_tokens == cached
        return n

    def _entry(self, seq: Sequence, n: int, lookahead: int = 0) -> ScheduledSequence:
        start = seq.num_computed_tokens
        sample = start + n == seq.num_tokens
        num_samples = seq.request.n if sample and not seq.request.forked and seq.index == 0 else 1
        table = self.bm.get_block_table(seq.seq_id)
        slots = table_slots(table, start, start + n, self.bm.block_size)
        return ScheduledSequence(seq.seq_id, seq.request_id, seq.index, seq.token_slice(start, start + n),
                                 start, table, slots, sample, num_samples, seq.sampling_params, lookahead,
                                 seq.request.seed, seq)

    def _fork_samples(self, seq: Sequence, num_samples: int) -> list[Sequence]:
        if num_samples == 1:
            return [seq]
        seq.request.forked = True
        return [seq] + [self.fork_sequence(seq.seq_id) for _ in range(num_samples - 1)]

    def _append_round(self, seq: Sequence, tokens: list[int], res: UpdateResult) -> bool:
        """Appends a speculative round's tokens up to the first that finishes the sequence.

        Token i > 0 follows accepted draft token i - 1, whose K/V the round wrote, so each step
        counts one more computed token. Unused lookahead slots are returned. Returns finished.
        """
        start = seq.num_computed_tokens - 1
        for i, token in enumerate(tokens):
            seq.num_computed_tokens += bool(i)
            if self._append_token(seq, token, res):
                return True
        self.bm.truncate(seq.seq_id, seq.num_computed_tokens)
        if seq.num_computed_tokens // self.bm.block_size > start // self.bm.block_size:
            self.bm.cache_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens)
        return False

    def _append_token(self, seq: Sequence, token: int, res: UpdateResult) -> bool:
        """Appends a sampled token; returns whether that finished the sequence."""
        seq.output_token_ids.append(token)
        res.new_token_ids[seq.seq_id] = token
        params = seq.sampling_params
        # Same order as vLLM: a length cap wins over a stop token arriving at the same time.
        max_tokens = params.max_tokens
        if (max_tokens is not None and len(seq.output_token_ids) >= max_tokens) \
                or seq.num_tokens >= self.max_model_len:
            self._finish(seq, SequenceStatus.FINISHED_LENGTH_CAPPED)
        elif (not getattr(params, "ignore_eos", False) and token == self.eos_token_id) \
                or token in (getattr(params, "stop_token_ids", None) or ()):
            seq.stop_reason = token
            self._finish(seq, SequenceStatus.FINISHED_STOPPED)
        else:
            return False
        return True

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.bm.free(seq.seq_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = status
        self.seqs.pop(seq.seq_id, None)

