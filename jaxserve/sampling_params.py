"""User-facing generation parameters, shaped like vLLM's (host-side, no JAX)."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxserve.validation import check_bool, check_int, check_number, check_token_ids


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to draw each request's tokens. ``temperature=0`` is greedy; ``top_k=0`` disables top-k.

    ``seed`` fixes the request's random stream: the same seed gives the same tokens whatever
    else is in the batch. ``logprobs=True`` returns the log-probability (under the model's
    unmodified distribution) of each chosen token; with speculative decoding, the target's (read
    from the verify pass, as vLLM reports them). ``top_logprobs=k`` (1..MAX_TOP_LOGPROBS, with
    ``logprobs=True``) also returns, at each position, the ``k`` most likely tokens and their
    log-probabilities (vLLM's ``logprobs=k``); not with speculative decoding.

    Every field is checked strictly (``jaxserve.validation``): integers must be ints (not bool or
    float), numbers finite; ``TypeError``/``ValueError`` name the field and the value.
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
    top_logprobs: int = 0

    def __post_init__(self):
        f, set_ = "SamplingParams.", lambda k, v: object.__setattr__(self, k, v)
        set_("n", check_int(f + "n", self.n, 1))
        set_("max_tokens", check_int(f + "max_tokens", self.max_tokens, 1))
        set_("temperature", _check_temperature(self.temperature))
        set_("top_k", check_int(f + "top_k", self.top_k, 0, 2**31))  # 0 disables it
        set_("top_p", check_number(f + "top_p", self.top_p, 0.0, 1.0, lo_open=True))
        if np.float32(self.top_p) == 0:  # the sampler filters in float32
            raise ValueError(f"SamplingParams.top_p must be > 0 in float32, got {self.top_p!r}")
        set_("seed", check_int(f + "seed", self.seed, 0, 2**32, optional=True))
        set_("stop_token_ids", _check_stop_tokens(self.stop_token_ids))
        set_("ignore_eos", check_bool(f + "ignore_eos", self.ignore_eos))
        set_("logprobs", check_bool(f + "logprobs", self.logprobs))
        set_("top_logprobs", check_int(f + "top_logprobs", self.top_logprobs, 0, MAX_TOP_LOGPROBS + 1))
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"SamplingParams.top_logprobs={self.top_logprobs} needs logprobs=True")

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
        f, set_ = "BeamSearchParams.", lambda k, v: object.__setattr__(self, k, v)
        set_("beam_width", check_int(f + "beam_width", self.beam_width, 1))
        set_("max_tokens", check_int(f + "max_tokens", self.max_tokens, 1))
        set_("length_penalty", check_number(f + "length_penalty", self.length_penalty))
        set_("ignore_eos", check_bool(f + "ignore_eos", self.ignore_eos))


# The most top_logprobs a request may ask for: the runner's step returns this many candidates per row.
MAX_TOP_LOGPROBS = 16

# Below this a float32 logit / temperature overflows to inf (and the row's softmax is NaN); use 0 for greedy.
MIN_TEMPERATURE = 1e-5
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_temperature(t) -> float:
    t = check_number("SamplingParams.temperature", t, 0.0)
    if t > _FLOAT32_MAX:  # inf in the sampler's float32
        raise ValueError(f"SamplingParams.temperature must be <= {_FLOAT32_MAX:g} (float32's largest), got {t!r}")
    if 0 < t < MIN_TEMPERATURE:
        raise ValueError(f"SamplingParams.temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {t!r}")
    return t


def _check_stop_tokens(ids) -> tuple[int, ...]:
    ids = check_token_ids("SamplingParams.stop_token_ids", ids)
    if any(t >= 2**31 for t in ids):
        raise ValueError(f"SamplingParams.stop_token_ids must be < 2**31, got {max(ids)}")
    return tuple(ids)
