"""The OpenAI API's request bodies as pydantic models, and its error shape (host only).

A body that does not parse or has a wrongly typed field is a schema error (FastAPI answers 422); a
well-typed value that jaxserve rejects (``top_p=0``, a prompt too long) is an ``ApiError`` (400) that
names the field. Fields OpenAI defines and jaxserve does not implement are accepted only at their
neutral value; unknown fields are ignored, as vLLM does.
"""
from __future__ import annotations

import re
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from jaxserve.sampling_params import MAX_TOP_LOGPROBS, SamplingParams

Prompt = Union[str, list[str], list[int], list[list[int]]]


class ApiError(Exception):
    """An error the client caused (or the server hit), answered as OpenAI's ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """The fields completions and chat share."""
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = Field(0, description="0 (or -1, vLLM's spelling) disables top-k")
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False  # vLLM's extension, for benchmarks
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(s == "" for s in stops):
            raise ApiError(400, "stop strings must not be empty", "stop")
        return stops

    def check_unsupported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise ApiError(400, f"{name} is not supported by jaxserve (got {getattr(self, name)}); use 0", name)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters; a value SamplingParams rejects is a 400 naming its field."""
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=self.temperature,
                                  top_k=0 if self.top_k == -1 else self.top_k, top_p=self.top_p, seed=self.seed,
                                  n=self.n, stop_token_ids=tuple(self.stop_token_ids or ()),
                                  ignore_eos=self.ignore_eos, logprobs=self.wants_logprobs,
                                  top_logprobs=self.num_top_logprobs)
        except (TypeError, ValueError) as e:
            raise ApiError(400, str(e), _field_of(str(e))) from None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    prompt: Prompt
    max_tokens: int | None = 16
    logprobs: int | None = None  # OpenAI: the chosen token's log-prob and this many top alternatives
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if self.echo:
            raise ApiError(400, "echo is not supported by jaxserve", "echo")
        if self.suffix:
            raise ApiError(400, "suffix is not supported by jaxserve", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ApiError(400, f"best_of={self.best_of} is not supported: only best_of == n", "best_of")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"logprobs must be between 0 and {MAX_TOP_LOGPROBS} (top alternatives per token), "
                                f"got {self.logprobs}", "logprobs")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def num_top_logprobs(self) -> int:
        return self.logprobs or 0


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # None: until max_model_len
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, f"top_logprobs={self.top_logprobs} needs logprobs=true", "top_logprobs")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs

    @property
    def num_top_logprobs(self) -> int:
        return self.top_logprobs or 0

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _field_of(message: str) -> str | None:
    """``"SamplingParams.top_p must be ..."`` -> ``"top_p"``."""
    m = re.search(r"SamplingParams\.(\w+)", message)
    return m.group(1) if m else None
