"""User-facing generation parameters, shaped like vLLM's (host-side, no JAX)."""
from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to draw each request's tokens. ``temperature=0`` is greedy; ``top_k=0`` disables top-k.

    ``seed`` fixes the request's random stream: the same seed gives the same tokens whatever
    else is in the batch. ``logprobs=True`` returns the log-probability (under the model's
    unmodified distribution) of each chosen token; with speculative decoding, the target's (read
    from the verify pass, as vLLM reports them).
    """
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    logprobs: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int = 4
    max_tokens: int = 16
    length_penalty: float = 1.0
    ignore_eos: bool = False

    def __post_init__(self):
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
