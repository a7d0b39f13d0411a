"""What generation returns, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | None = None  # the EOS / stop token that ended it
    logprobs: list[float] | None = None  # of each chosen token, when SamplingParams.logprobs
    cumulative_logprob: float | None = None
    # per position, the SamplingParams.top_logprobs most likely (token id, log-prob), most likely first
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
