"""The front door, shaped like vLLM's offline ``LLM``: ``LLM(model=...).generate(prompts, params)``."""
from __future__ import annotations

import dataclasses
from typing import Sequence as Seq

from tqdm.auto import tqdm

from jaxserve.config import EngineConfig, ModelConfig
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.outputs import RequestOutput
from jaxserve.models.loading import resolve_model
from jaxserve.engine.beam_search import BeamSearchOutput, beam_search
from jaxserve.sampling_params import BeamSearchParams, SamplingParams

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


class LLM:
    """Offline batched generation over a paged KV cache with continuous batching.

    ``model``: ``"jaxserve/<zoo name>"``, a jaxserve checkpoint directory, or a local Hugging Face
    directory. Keyword arguments override ``EngineConfig`` fields (``block_size``,
    ``num_kv_blocks``, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``enable_prefix_caching``, ``attention_impl``, ...) and ``dtype`` the model's dtype.
    """

    def __init__(self, model: str, *, dtype: str | None = None, **engine_overrides):
        engine_config = _engine_config(engine_overrides)
        config, params, tokenizer = resolve_model(model, dtype)
        self.engine = LLMEngine(config, params, tokenizer, engine_config)

    @classmethod
    def from_params(cls, config: ModelConfig, params: dict, tokenizer=None, **engine_overrides) -> "LLM":
        """An LLM over in-memory params (random models in tests and notebooks)."""
        self = cls.__new__(cls)
        self.engine = LLMEngine(config, params, tokenizer, _engine_config(engine_overrides))
        return self

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generates for every prompt; returns ``RequestOutput``s in prompt order.

        Every prompt and parameter is validated before any request is queued.
        """
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], int)):
            prompts = [prompts]
        sampling_params = SamplingParams() if sampling_params is None else sampling_params
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) \
            else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        engine = self.engine
        for i, (p, sp) in enumerate(zip(prompts, params)):  # validate all first: nothing queued on error
            if not isinstance(sp, SamplingParams):
                raise ValueError(f"expected SamplingParams for prompt {i}, got {type(sp).__name__}")
            engine.scheduler.validate_request(f"_check_{i}", engine.tokenize(p), sp)
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req") as bar:
            while engine.has_unfinished():
                done = sum(t.finished for t in engine.step())
                bar.update(done)
        return [engine.finished.pop(i) for i in ids]

    def beam_search(self, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search per prompt; beams share KV blocks through fork and copy-on-write."""
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], int)):
            prompts = [prompts]
        return beam_search(self.engine, prompts, params)

    def warmup(self) -> int:
        """Compiles every shape bucket now; returns how many programs that took."""
        return self.engine.runner.warmup()

    def stats(self) -> dict:
        """KV blocks used/free/cached, prefix-cache hit rate, preemptions, compilations."""
        return self.engine.stats()


def _engine_config(overrides: dict) -> EngineConfig:
    unknown = sorted(set(overrides) - _ENGINE_FIELDS)
    if unknown:
        raise ValueError(f"unknown LLM option(s) {unknown}; engine options are {sorted(_ENGINE_FIELDS)}")
    return EngineConfig(**overrides)
