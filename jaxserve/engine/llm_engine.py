"""The engine loop: scheduler (host) + runner (device) + sampling, one ``step()`` at a time.

``LLMEngine`` is the level for experiments that drive arrivals themselves: ``add_request``,
``step`` (returns the tokens produced this step, for streaming), ``abort``, ``stats``.
The device work of a step is one ``ModelRunner.execute``; with ``speculative`` set the runner runs one
speculative round for the decoding sequences, and a step may produce up to γ+1 tokens per sequence.
"""
from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence as Seq

import jax
import numpy as np

from jaxserve.cache.block_manager import BlockManager
from jaxserve.cache.kv_pool import kv_pool_bytes_per_block
from jaxserve.cache.reservation import ContiguousReservations
from jaxserve.config import EngineConfig, ModelConfig
from jaxserve.engine.compile_cache import enable_compilation_cache
from jaxserve.engine.memory import check_kv_fits, check_params_finite
from jaxserve.engine.outputs import CompletionOutput, RequestOutput
from jaxserve.engine.proposer import Proposer
from jaxserve.engine.runner import ModelRunner
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.sequence import FINISH_REASONS, Request
from jaxserve.engine.spec_policy import SpeculationPolicy
from jaxserve.engine.speculative_stats import SpeculativeStats
from jaxserve.models.attention_backends import attention_backend
from jaxserve.parallel.layout import make_layout
from jaxserve.quant import MatmulSettings, quantize_params, quantized_shapes
from jaxserve.sampling_params import SamplingParams
from jaxserve.speculative.config import SpeculativeConfig
from jaxserve.validation import check_token_ids


@dataclass(frozen=True)
class StepToken:
    """A token produced by a step (for streaming): sample ``index`` of request ``request_id``."""
    request_id: str
    index: int
    token_id: int
    finished: bool
    logprob: float | None = None  # its log-probability under the target's raw logits
    top_logprobs: tuple[tuple[int, float], ...] | None = None  # the k most likely (token id, log-prob), when asked


class LLMEngine:
    def __init__(self, config: ModelConfig, params: dict, tokenizer=None,
                 engine_config: EngineConfig = EngineConfig(), speculative: SpeculativeConfig | None = None,
                 proposer: Proposer | None = None, router_state: dict | None = None):
        if not isinstance(engine_config, EngineConfig):
            raise TypeError(f"engine_config must be an EngineConfig, got {type(engine_config).__name__}")
        ec = engine_config
        if speculative is not None and ec.max_num_batched_tokens < 1 + speculative.gamma:
            raise ValueError(f"max_num_batched_tokens={ec.max_num_batched_tokens} leaves no room for a speculative "
                             f"round of 1 + {speculative.gamma} tokens")
        if speculative is not None and ec.num_scheduler_steps > 1:
            raise ValueError(f"EngineConfig.num_scheduler_steps={ec.num_scheduler_steps} cannot be combined with "
                             "speculative decoding (its rounds already emit several tokens a program): use 1")
        self.config, self.engine_config, self.tokenizer = config, ec, tokenizer
        # the device mesh: every size checked against the model and the visible devices before anything is built
        layout = make_layout(config, ec.tensor_parallel_size, ec.data_parallel_size, ec.enable_expert_parallel,
                             moe_dispatch=ec.moe_dispatch)
        run_config = config
        if layout is not None:  # KV heads repeated up to T before quantizing; every split checked on shapes only
            run_config, params = layout.prepare(config, params)
            if ec.quantization is not None:
                try:
                    layout.param_specs(quantized_shapes(params, ec.quantization))
                except ValueError as e:
                    raise ValueError(f"quantization={ec.quantization!r} with tensor_parallel_size="
                                     f"{ec.tensor_parallel_size}: {e}") from None
        enable_compilation_cache()  # a real model's step programs compile once per machine, not per process
        if ec.max_model_len is not None and ec.max_model_len > config.max_position_embeddings:
            raise ValueError(f"EngineConfig.max_model_len={ec.max_model_len} exceeds the model's "
                             f"max_position_embeddings={config.max_position_embeddings}")
        self.max_model_len = ec.max_model_len or config.max_position_embeddings
        check_params_finite(params, "model")
        if proposer is not None and proposer.params is not None:
            check_params_finite(proposer.params, f"{proposer.method} proposer")
        block_bytes = kv_pool_bytes_per_block(config.num_layers, ec.block_size, config.num_kv_heads, config.head_dim,
                                              attention_backend(ec.attention_impl).storage_dtype(config.dtype))
        num_blocks = ec.num_kv_blocks or ec.kv_cache_bytes // block_bytes
        if num_blocks < 1:
            raise ValueError(f"kv_cache_bytes={ec.kv_cache_bytes} is smaller than one KV block")
        eos = tokenizer.eos_token_id if tokenizer is not None and tokenizer.eos_token_id is not None \
            else config.eos_token_id
        admission = None  # paged: whatever the blocks allow
        if ec.kv_allocation != "paged":  # an Orca baseline: contiguous reservations over the same memory
            admission = ContiguousReservations(ec.kv_allocation, num_blocks * ec.block_size, self.max_model_len)
            # A spare block per seat for its partial last block: the token-granular reservations,
            # not block rounding, must be what limits admission.
            num_blocks += ec.max_num_seqs
        check_kv_fits(num_blocks, block_bytes, "num_kv_blocks" if ec.num_kv_blocks else "kv_cache_bytes")
        self.block_manager = BlockManager(num_blocks, ec.block_size, ec.enable_prefix_caching)
        self.spec_policy = None
        if speculative is not None and (speculative.adaptive or speculative.disable_by_batch_size is not None):
            if speculative.adaptive and jax.process_count() > 1:
                raise ValueError("SpeculativeConfig.adaptive times steps on each process's clock: several "
                                 "processes running one scheduler would diverge; use disable_by_batch_size")
            self.spec_policy = SpeculationPolicy(speculative.gamma, speculative.disable_by_batch_size,
                                                 speculative.adaptive)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=ec.max_num_seqs,
                                   max_num_batched_tokens=ec.max_num_batched_tokens,
                                   max_model_len=self.max_model_len, admission=admission, eos_token_id=eos,
                                   num_lookahead_slots=speculative.gamma if speculative else 0,
                                   max_num_partial_prefills=ec.max_num_partial_prefills,
                                   speculation_policy=self.spec_policy,
                                   num_scheduler_steps=ec.num_scheduler_steps)
        quant = None
        if ec.quantization is not None:  # weight-only post-training quantization, once, on the host
            params = quantize_params(params, ec.quantization, lm_head=ec.quantize_lm_head)
            quant = MatmulSettings(impl=ec.quant_impl, w4a8=ec.activation_quantization == "int8")
        self.runner = ModelRunner(run_config, params, num_blocks=num_blocks, block_size=ec.block_size,
                                  max_num_seqs=ec.max_num_seqs, max_num_batched_tokens=ec.max_num_batched_tokens,
                                  max_model_len=self.max_model_len, attention_impl=ec.attention_impl, quant=quant,
                                  router_state=router_state, max_num_partial_prefills=ec.max_num_partial_prefills,
                                  speculative=speculative, proposer=proposer if speculative else None,
                                  layout=layout, weight_layout=ec.weight_layout,
                                  lm_head_quantization=ec.lm_head_quantization,
                                  num_scheduler_steps=ec.num_scheduler_steps)
        self.speculative = speculative
        self.spec_stats = None if speculative is None else SpeculativeStats(proposer.method, speculative.gamma)
        self._rng = np.random.default_rng(ec.seed)
        self._ids = itertools.count()
        self._prompts: dict[str, str | None] = {}
        self._logprobs: dict[tuple[str, int], list[float]] = defaultdict(list)
        # per (request, sample): each position's top_logprobs most likely (token id, log-prob), when asked
        self._top: dict[tuple[str, int], list[tuple[tuple[int, float], ...]]] = defaultdict(list)
        self.finished: dict[str, RequestOutput] = {}

    # ---- requests ---------------------------------------------------------------------------

    def tokenize(self, prompt: str | Seq[int], label: str = "prompt") -> list[int]:
        """A prompt's token ids: a ``str`` through the tokenizer, or a sequence of ints in ``[0, vocab)``
        (not floats, bools, bytes); ``TypeError``/``ValueError`` name ``label`` and the value."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{label}: this model has no tokenizer: pass prompts as lists of token ids")
            return check_token_ids(label, self.tokenizer.encode(prompt), self.config.vocab_size)
        return check_token_ids(label, prompt, self.config.vocab_size)

    def validate_request(self, prompt: str | Seq[int], sampling_params: SamplingParams,
                         label: str = "prompt") -> list[int]:
        """Every check of ``add_request`` without queuing anything; returns the prompt's token ids."""
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"{label}: expected SamplingParams, got {type(sampling_params).__name__}")
        if sampling_params.top_logprobs and self.speculative is not None:
            raise ValueError(f"{label}: SamplingParams.top_logprobs={sampling_params.top_logprobs} is not available "
                             "with speculative decoding (its rounds return only the chosen tokens' log-probs)")
        token_ids = self.tokenize(prompt, label)
        self.scheduler.validate_request(None, token_ids, sampling_params, label=label)
        return token_ids

    def add_request(self, prompt: str | Seq[int], sampling_params: SamplingParams,
                    request_id: str | None = None) -> str:
        """Queues a prompt; every user error raises before any state changes.

        ``request_id``: a str not used by any live request or unclaimed result in ``finished``
        (None: a fresh one that is neither).
        """
        if request_id is not None:
            if not isinstance(request_id, str):
                raise TypeError(f"request_id must be a str or None, got {request_id!r}")
            if request_id in self.scheduler.requests or request_id in self.finished:
                raise ValueError(f"request id {request_id!r} is already in use")
        label = "prompt" if request_id is None else f"request {request_id!r}"
        token_ids = self.validate_request(prompt, sampling_params, label)
        request_id = self._new_id() if request_id is None else request_id
        seed = sampling_params.seed
        seed = int(self._rng.integers(2**32)) if seed is None else seed
        self.scheduler.add_request(request_id, token_ids, sampling_params, seed)
        self._prompts[request_id] = prompt if isinstance(prompt, str) else None
        return request_id

    def _new_id(self) -> str:
        while True:  # skip ids a user took: results are never overwritten
            rid = str(next(self._ids))
            if rid not in self.scheduler.requests and rid not in self.finished:
                return rid

    def forget(self, request_id: str) -> None:
        """Drops every trace of a request that is no longer live (its result included)."""
        self.finished.pop(request_id, None)
        self._prompts.pop(request_id, None)
        for per_sample in (self._logprobs, self._top):
            for key in [k for k in per_sample if k[0] == request_id]:
                del per_sample[key]

    def abort(self, request_id: str) -> RequestOutput:
        """Stops a request and frees its blocks; an unknown id is a ``ValueError``."""
        return self._finish(self.scheduler.abort(request_id))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step ---------------------------------------------------------------------------

    def step(self) -> list[StepToken]:
        if not self.scheduler.has_unfinished():
            return []
        out = self.scheduler.schedule()
        if out.is_empty:
            raise RuntimeError("the scheduler could not schedule any work: the KV pool is too small for "
                               "the running requests")
        seqs = self.scheduler.seqs
        before = {e.seq_id: (seqs[e.seq_id], len(seqs[e.seq_id].output_token_ids)) for e in out.scheduled}
        want_top = any(self._top_k(e) for e in out.scheduled)
        start = time.perf_counter()
        # log-probs are computed in a step only when a request in it asks for them (vLLM's rule)
        want_logprobs = any(e.sample and e.sampling_params.logprobs for e in out.scheduled)
        result = (self.runner.execute(out, top_logprobs=True) if want_top
                  else self.runner.execute(out, logprobs=want_logprobs))
        if self.spec_policy is not None:
            self._record_policy(out, result, time.perf_counter() - start)
        for key, lps in result.logprobs.items():  # a round's run past a stop is cut with its tokens in _finish
            self._logprobs[key].extend(lps)
        tops = {e.seq_id: top for e in out.scheduled if (top := self._top_of(e, result.top)) is not None}
        for e in out.scheduled:
            for j in range(e.num_samples if e.seq_id in tops else 0):  # a plain step: one token per sample
                self._top[(e.request_id, e.index + j)].append(tops[e.seq_id])
        res = self.scheduler.update(out, result.sampled)
        finished = {r.request_id for r in res.finished}
        for req in res.finished:
            self._finish(req)
        produced = []
        for e in out.scheduled:
            seq, n = before[e.seq_id]
            family = [seq] + ([s for s in seq.request.seqs if s.index > 0] if e.num_samples > 1 else [])
            for s in family:  # an n>1 prefill's forked samples got their first token this step
                start = n if s is seq else 0
                lps = result.logprobs.get((e.request_id, s.index), [])
                produced += [StepToken(e.request_id, s.index, t, e.request_id in finished,
                                       lps[i] if i < len(lps) else None, tops.get(e.seq_id))
                             for i, t in enumerate(s.output_token_ids[start:])]
        if self.spec_stats is not None:
            drafted = [result.drafted[k] for k in result.accepted] if result.drafted else None
            self.spec_stats.record_step(list(result.accepted.values()), result.target_rows, len(produced), drafted)
        return produced

    def _record_policy(self, out, result, seconds: float) -> None:
        """A step where every entry decodes one token (all with lookahead, or none) times its arm."""
        entries = out.scheduled
        if not entries or any(len(e.token_ids) != 1 or not e.seq.output_token_ids for e in entries):
            return
        rounds = sum(bool(e.num_lookahead) for e in entries)
        if rounds not in (0, len(entries)):
            return
        per_row = 1 + sum(result.accepted.values()) / rounds if rounds else None
        self.spec_policy.record(bool(rounds), len(entries), seconds, per_row)

    @staticmethod
    def _top_k(e) -> int:
        """How many top candidates a scheduled entry wants this step (0 unless it samples and asked)."""
        return getattr(e.sampling_params, "top_logprobs", 0) if e.sample else 0

    def _top_of(self, e, top: dict) -> tuple[tuple[int, float], ...] | None:
        """The entry's ``top_logprobs`` most likely next tokens, if it sampled and asked for them."""
        k = self._top_k(e)
        if not k or e.seq_id not in top:
            return None
        lps, ids = top[e.seq_id]
        return tuple((int(t), float(lp)) for t, lp in zip(ids[:k], lps[:k]))

    def _finish(self, req: Request) -> RequestOutput:
        rid = req.request_id
        outputs = []
        for seq in sorted(req.seqs, key=lambda s: s.index):
            lps = self._logprobs.pop((rid, seq.index), [])[: len(seq.output_token_ids)]
            top = self._top.pop((rid, seq.index), [])[: len(seq.output_token_ids)]
            text = self.tokenizer.decode(seq.output_token_ids) if self.tokenizer is not None else ""
            sp = seq.sampling_params
            outputs.append(CompletionOutput(seq.index, text, list(seq.output_token_ids),
                                            FINISH_REASONS.get(seq.status), seq.stop_reason,
                                            lps if sp.logprobs else None, float(np.sum(lps)) if sp.logprobs else None,
                                            [list(t) for t in top] if sp.top_logprobs else None))
        result = RequestOutput(rid, self._prompts.pop(rid, None), list(req.prompt_token_ids), outputs, True)
        self.finished[rid] = result
        return result

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache when no request is in flight (``BlockManager.reset_prefix_cache``)."""
        return not self.scheduler.has_unfinished() and self.block_manager.reset_prefix_cache()

    def stats(self) -> dict:
        stats = {**self.scheduler.stats(), "compilations": self.runner.num_compilations,
                 "buckets": self.runner.num_buckets}
        if self.spec_stats is not None:
            stats.update(self.spec_stats.as_dict())
        if self.spec_policy is not None:  # steps whose decodes got lookahead slots, and steps that ran them plain
            stats.update({f"spec_{k}": v for k, v in self.spec_policy.counts.items()})
            if self.runner.draft_pool is not None:  # positions the draft ran over alone, after plain steps
                stats["spec_draft_catch_up_tokens"] = self.runner.draft_catch_up_tokens
        return stats
