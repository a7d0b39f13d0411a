"""Requests and sequences: the host-side state of generation (no JAX).

A ``Request`` is what a user submitted: an id, prompt token ids, and sampling params (opaque
here; read attributes: ``max_tokens``, ``stop_token_ids``, ``ignore_eos``, ``n``). It owns one
``Sequence`` per sample; with ``n > 1`` it starts with one and the scheduler forks the other
``n - 1`` when the prompt's prefill completes, so all samples share the prompt's KV blocks.

A ``Sequence`` is one stream of tokens (prompt + outputs) and how much of it has K/V in the
pool (``num_computed_tokens``). Each step runs ``token_ids[num_computed:num_computed + k]``; a
token is sampled when the step reaches the end (``num_computed == num_tokens``). Prefill,
chunked prefill, decode and recompute after preemption are all that one rule.
"""
from __future__ import annotations

import enum
from typing import Any, Sequence as Seq


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, blocks freed, will recompute
    FINISHED_STOPPED = "finished_stopped"  # EOS or a stop token
    FINISHED_LENGTH_CAPPED = "finished_length_capped"  # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH_CAPPED,
             SequenceStatus.FINISHED_ABORTED}

# vLLM's finish_reason strings.
FINISH_REASONS = {SequenceStatus.FINISHED_STOPPED: "stop",
                  SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
                  SequenceStatus.FINISHED_ABORTED: "abort"}


class Sequence:
    """One token stream. ``index`` is its sample number within the request (0..n-1)."""

    def __init__(self, seq_id: int, request: "Request", index: int,
                 output_token_ids: Seq[int] = ()):
        self.seq_id = seq_id
        self.request = request
        self.index = index
        self.output_token_ids: list[int] = list(output_token_ids)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.stop_reason: int | None = None  # the EOS / stop token that finished it

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def sampling_params(self) -> Any:
        return self.request.sampling_params

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by outputs (a new list)."""
        return self.request.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, stop: int) -> list[int]:
        """``token_ids[start:stop]`` without copying the whole stream (hot path: every step)."""
        prompt, p = self.request.prompt_token_ids, len(self.request.prompt_token_ids)
        if stop <= p:
            return prompt[start:stop]
        if start >= p:
            return self.output_token_ids[start - p:stop - p]
        return prompt[start:] + self.output_token_ids[:stop - p]

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, request={self.request_id!r}, {self.status.name}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")


class Request:
    """A submitted prompt and its samples (``seqs``; ``n`` of them once forked)."""

    def __init__(self, request_id: str, prompt_token_ids: Seq[int], sampling_params: Any,
                 arrival: int = 0, seed: int = 0):
        self.request_id = request_id
        self.seed = seed  # the request's RNG seed (sampling_params.seed, or one the engine drew)
        self.prompt_token_ids: list[int] = [int(t) for t in prompt_token_ids]
        self.sampling_params = sampling_params
        self.arrival = arrival
        self.seqs: list[Sequence] = []
        self.forked = False  # the n-1 sibling samples exist

    @property
    def n(self) -> int:
        return getattr(self.sampling_params, "n", 1)

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs) and (self.forked or self.n == 1
                                                          or self.aborted)

    @property
    def aborted(self) -> bool:
        return any(s.status is SequenceStatus.FINISHED_ABORTED for s in self.seqs)

    def __repr__(self) -> str:
        return f"Request({self.request_id!r}, prompt_len={len(self.prompt_token_ids)}, seqs={self.seqs})"
