"""The front door, shaped like vLLM's offline ``LLM``: ``LLM(model=...).generate(prompts, params)``."""
from __future__ import annotations

import dataclasses
import numbers
import os
import threading
from typing import Sequence as Seq

import numpy as np
from tqdm.auto import tqdm

from jaxserve.config import DTYPES, EngineConfig, ModelConfig
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.proposer import Proposer
from jaxserve.engine.outputs import RequestOutput
from jaxserve.models.loading import model_path, resolve_model, with_matmul_dtype
from jaxserve.moe.router_state_file import load_router_state
from jaxserve.engine.beam_search import BeamSearchOutput, beam_search
from jaxserve.sampling_params import BeamSearchParams, SamplingParams
from jaxserve.speculative.config import (SpeculativeConfig, check_draft_matches, check_eagle_matches,
                                         check_medusa_matches)
from jaxserve.speculative.draft_vocab import restrict_head
from jaxserve.speculative.token_counts import load_counts, most_frequent

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


class LLM:
    """Offline batched generation over a paged KV cache with continuous batching.

    ``model``: ``"jaxserve/<zoo name>"``, a jaxserve checkpoint directory, or a local Hugging Face
    directory. Keyword arguments override ``EngineConfig`` fields (``block_size``,
    ``num_kv_blocks``, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``enable_prefix_caching``, ``attention_impl``, ...), ``dtype`` the model's dtype and ``matmul_dtype``
    its Dense layers' dot operands (float32 sums; "bfloat16" on a float32 model: TPU's default precision).
    ``speculative``: a ``SpeculativeConfig`` (draft model, n-gram lookup or Medusa heads); every
    check against the target runs before anything is built.

    Options are checked strictly (ints are ints, flags bools; ``max_model_len`` above the model's
    ``max_position_embeddings`` is an error, not clamped), and so is the model: NaN/inf params are refused.
    One ``LLM`` may be shared by threads: its calls run one at a time.
    """

    def __init__(self, model: str, *, dtype: str | None = None, matmul_dtype: str | None = None,
                 speculative: SpeculativeConfig | None = None, **engine_overrides):
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"LLM: model must be a str (zoo name or path), got {model!r}")
        model = os.fspath(model)
        for name, value in (("dtype", dtype), ("matmul_dtype", matmul_dtype)):
            if value is not None and value not in DTYPES:
                raise ValueError(f"LLM: {name} must be None or one of {DTYPES}, got {value!r}")
        self._lock = threading.RLock()
        engine_config = _engine_config(engine_overrides)
        _check_speculative(speculative)
        config, params, tokenizer = resolve_model(model, dtype, matmul_dtype)
        # an MoE trained with loss-free balancing routes with its learned biases (state beside the weights)
        router_state = load_router_state(model_path(model)) if config.num_experts else None
        proposer = _load_proposer(speculative, config, tokenizer, dtype, matmul_dtype)
        self.engine = LLMEngine(config, params, tokenizer, engine_config, speculative, proposer, router_state)

    @classmethod
    def from_params(cls, config: ModelConfig, params: dict, tokenizer=None, *,
                    speculative: SpeculativeConfig | None = None, draft=None, router_state: dict | None = None,
                    **engine_overrides) -> "LLM":
        """An LLM over in-memory params (random models in tests and notebooks).

        With ``speculative``, ``draft`` gives the proposer's weights in memory: ``(ModelConfig, params)``
        (or with a third item, the draft's tokenizer, and a fourth, its token counts i64[V] for
        ``draft_vocab_size``) for ``draft_model``, ``(MedusaConfig, params)`` for ``medusa``; None for
        ``ngram`` and ``suffix`` or to load from the paths in ``speculative``.
        ``router_state``: an MoE's loss-free balancing biases (``jaxserve.moe.init_router_state`` layout).
        """
        engine_config = _engine_config(engine_overrides)
        _check_speculative(speculative)
        if speculative is not None and draft is not None:
            draft_config, draft_params = draft[:2]
            if speculative.method == "draft_model" and speculative.draft_matmul_dtype is not None:
                draft_config, draft_params = with_matmul_dtype(draft_config, draft_params,
                                                               speculative.draft_matmul_dtype)
            proposer = _proposer(speculative, config, tokenizer, draft_config, draft_params,
                                 draft[2] if len(draft) > 2 else tokenizer, draft[3] if len(draft) > 3 else None)
        else:
            proposer = _load_proposer(speculative, config, tokenizer, None, None)
        self = cls.__new__(cls)
        self._lock = threading.RLock()
        self.engine = LLMEngine(config, params, tokenizer, engine_config, speculative, proposer, router_state)
        return self

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generates for every prompt; returns ``RequestOutput``s in prompt order.

        Every prompt and parameter is validated before any request is queued (a bad one raises
        ``TypeError``/``ValueError`` naming ``prompt i``, and nothing changes). Calls from several
        threads run one at a time. If the loop raises (KeyboardInterrupt included), this call's
        requests are aborted and forgotten before the exception propagates.
        """
        with self._lock:
            prompts = _prompt_list(prompts)
            sampling_params = SamplingParams() if sampling_params is None else sampling_params
            params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) \
                else [sampling_params] * len(prompts)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
            engine = self.engine
            for i, (p, sp) in enumerate(zip(prompts, params)):  # validate all first: nothing queued on error
                engine.validate_request(p, sp, f"prompt {i}")
            ids = []
            try:
                for p, sp in zip(prompts, params):  # one at a time: an interrupt here is cleaned up too
                    ids.append(engine.add_request(p, sp))
                with tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req") as bar:
                    while engine.has_unfinished():
                        # (a step may produce several tokens, or samples, of a request that finished)
                        done = len({t.request_id for t in engine.step() if t.finished})
                        bar.update(done)
                return [engine.finished.pop(i) for i in ids]
            except BaseException:
                _abort_all(engine, ids)
                raise

    def chat(self, messages, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Generates the assistant's reply to one conversation (a list of ``{"role", "content"}`` dicts) or to
        each of a list of conversations, as vLLM's ``LLM.chat``.

        The model's chat template (from its GGUF metadata or ``tokenizer_config.json``) renders each
        conversation, ``add_generation_prompt`` opening the assistant's turn; generation stops at the
        template's end-of-turn token (added to each request's ``stop_token_ids``). ``outputs[i].prompt`` is the
        rendered prompt text.
        """
        tokenizer = self._chat_tokenizer()
        single = _is_conversation(messages)
        conversations = [messages] if single else list(messages)
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt) for c in conversations]
        sampling_params = SamplingParams() if sampling_params is None else sampling_params
        params = [with_stop_ids(sp, tokenizer.end_of_turn_ids) if isinstance(sp, SamplingParams) else sp
                  for sp in (sampling_params if isinstance(sampling_params, (list, tuple))
                             else [sampling_params] * len(texts))]
        outs = self.generate([tokenizer.encode(t, add_special_tokens=False) for t in texts], params, use_tqdm)
        for out, text in zip(outs, texts):
            out.prompt = text
        return outs

    def stream_chat(self, conversation, sampling_params: SamplingParams | None = None):
        """Yields the assistant's reply to ``conversation`` as text pieces while it is generated (``n == 1``)."""
        from jaxserve.engine.streaming import stream_request
        tokenizer = self._chat_tokenizer()
        sp = with_stop_ids(SamplingParams() if sampling_params is None else sampling_params, tokenizer.end_of_turn_ids)
        ids = tokenizer.encode_chat(conversation)  # errors here, before the generator starts
        return self._locked(stream_request(self.engine, ids, sp))

    def _locked(self, pieces):
        """Iterates ``pieces`` holding this LLM's lock (other threads' calls wait until the stream ends)."""
        with self._lock:
            yield from pieces

    def _chat_tokenizer(self):
        tokenizer = self.engine.tokenizer
        if tokenizer is None or tokenizer.chat_template is None:
            raise ValueError("chat needs a model with a chat template (in its GGUF metadata, tokenizer_config.json "
                             "or chat_template.jinja); this one has none: use generate")
        return tokenizer

    def beam_search(self, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search per prompt; beams share KV blocks through fork and copy-on-write."""
        with self._lock:
            if self.engine.speculative is not None:
                raise ValueError("beam_search is not available on an LLM built with speculative decoding")
            return beam_search(self.engine, _prompt_list(prompts), params)

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix (vLLM's ``LLM.reset_prefix_cache``): True when done, False (nothing changed)
        while requests are in flight. For timing a workload more than once from a cold cache."""
        with self._lock:
            return self.engine.reset_prefix_cache()

    def warmup(self) -> int:
        """Compiles every shape bucket now (with speculative decoding: its fill, round and copy
        programs); returns how many programs that took."""
        with self._lock:
            return self.engine.runner.warmup()

    def stats(self) -> dict:
        """KV blocks used/free/cached, prefix-cache hit rate, preemptions, compilations; with speculative
        decoding also ``spec_*``: acceptance rate, mean acceptance length, per-position acceptance, ..."""
        with self._lock:
            return self.engine.stats()


def _prompt_list(prompts) -> list:
    """One prompt (a str, or a sequence of token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, (bytes, bytearray)):
        raise TypeError(f"prompts must be a str, a list of str or a list of token-id lists, got bytes {prompts!r}")
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, np.ndarray):
        prompts = prompts.tolist() if prompts.ndim > 1 else [prompts.tolist()]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a str, a list of str or a list of token-id lists, got "
                        f"{type(prompts).__name__}")
    if len(prompts) and isinstance(prompts[0], numbers.Number):
        return [list(prompts)]  # one prompt of token ids (each id is checked later)
    return list(prompts)


def _abort_all(engine: LLMEngine, ids: list[str]) -> None:
    """Aborts what is still running of ``ids`` and drops their results: a failed call leaves no trace."""
    for rid in ids:
        if rid in engine.scheduler.requests:
            engine.abort(rid)
        engine.forget(rid)


def _is_conversation(messages) -> bool:
    """A single conversation (a list of message dicts), as opposed to a list of conversations."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Seq) or not messages:
        raise ValueError("chat expects a conversation (a list of {'role': ..., 'content': ...} dicts) or a list of "
                         f"conversations, got {messages!r:.80}")
    return isinstance(messages[0], dict)


def with_stop_ids(sp: SamplingParams, stop_ids) -> SamplingParams:
    """``sp`` also stopping at ``stop_ids`` (a chat's end-of-turn tokens)."""
    merged = tuple(dict.fromkeys([*sp.stop_token_ids, *stop_ids]))
    return sp if merged == sp.stop_token_ids else dataclasses.replace(sp, stop_token_ids=merged)


def _engine_config(overrides: dict) -> EngineConfig:
    unknown = sorted(set(overrides) - _ENGINE_FIELDS)
    if unknown:
        raise ValueError(f"unknown LLM option(s) {unknown}; engine options are {sorted(_ENGINE_FIELDS)}")
    return EngineConfig(**overrides)


def _check_speculative(spec) -> None:
    if spec is not None and not isinstance(spec, SpeculativeConfig):
        raise ValueError(f"speculative must be a SpeculativeConfig or None, got {type(spec).__name__}")


def _load_proposer(spec: SpeculativeConfig | None, config: ModelConfig, tokenizer, dtype,
                   matmul_dtype) -> Proposer | None:
    """Reads the proposer's weights from the paths in ``spec`` and checks them against the target."""
    if spec is None:
        return None
    if spec.method == "draft_model":
        if spec.draft_model is None:
            raise ValueError("SpeculativeConfig(method='draft_model') needs draft_model (a zoo name or directory)")
        draft_config, draft_params, draft_tokenizer = resolve_model(spec.draft_model, dtype,
                                                                    spec.draft_matmul_dtype or matmul_dtype)
        counts = None
        if spec.draft_vocab_size is not None:
            counts = load_counts(model_path(spec.draft_model), draft_config.vocab_size)
        return _proposer(spec, config, tokenizer, draft_config, draft_params, draft_tokenizer, counts)
    if spec.method == "eagle":
        if spec.draft_model is None:
            raise ValueError("SpeculativeConfig(method='eagle') needs draft_model (an EAGLE draft's directory)")
        from jaxserve.speculative.eagle import load_eagle
        return _proposer(spec, config, tokenizer, *load_eagle(model_path(spec.draft_model), dtype or config.dtype))
    if spec.method == "medusa":
        if spec.medusa_heads is None:
            raise ValueError("SpeculativeConfig(method='medusa') needs medusa_heads (a directory of trained heads)")
        from jaxserve.speculative.medusa import load_heads
        return _proposer(spec, config, tokenizer, *load_heads(spec.medusa_heads), None)
    return Proposer(spec.method)  # ngram, suffix: no weights


def _proposer(spec, config, tokenizer, proposer_config, proposer_params, proposer_tokenizer,
              token_counts=None) -> Proposer:
    if spec.method == "draft_model":
        check_draft_matches(config, proposer_config, tokenizer, proposer_tokenizer)
        if spec.draft_vocab_size is None:
            return Proposer(spec.method, proposer_config, proposer_params)
        if token_counts is None:
            raise ValueError("SpeculativeConfig.draft_vocab_size needs the draft's token counts: pass "
                             "draft=(config, params, tokenizer, counts) or load the draft from a directory with "
                             "token_counts.json")
        ids = most_frequent(np.asarray(token_counts), spec.draft_vocab_size)
        return Proposer(spec.method, proposer_config, proposer_params, restrict_head(proposer_config, proposer_params,
                                                                                     ids))
    if spec.method == "medusa":
        check_medusa_matches(config, proposer_config, spec.gamma)
        return Proposer(spec.method, proposer_config, proposer_params)
    if spec.method == "eagle":  # (proposer_tokenizer: the head's token ids i32[N])
        check_eagle_matches(config, proposer_config, proposer_tokenizer)
        return Proposer(spec.method, proposer_config, proposer_params, np.asarray(proposer_tokenizer, np.int32))
    return Proposer(spec.method)  # ngram, suffix: no weights
