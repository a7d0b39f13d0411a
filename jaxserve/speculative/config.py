"""``SpeculativeConfig``: how the engine speculates (host-side, no JAX).

``LLM(model=..., speculative=SpeculativeConfig(method="draft_model", draft_model="jaxserve/tiny-code-draft",
num_speculative_tokens=4))``. Methods:

- ``draft_model``: a small model with the target's vocabulary (and tokenizer) proposes γ tokens;
- ``eagle``: an EAGLE draft (``jaxserve.speculative.eagle``: one decoder layer over the target's hidden states,
  drafting from the target's own head cut to its frequent tokens; ``draft_model`` names its directory);
- ``ngram``: prompt lookup over the sequence's own tokens (no extra weights);
- ``medusa``: Medusa-1 heads on the target's last hidden state (``medusa_heads``: a directory
  written by ``python -m experiments.medusa_heads``); γ is at most the number of heads;
- ``suffix``: SuffixDecoding (``jaxserve.speculative.suffix_tree``): suffix trees on the host over the
  request's prompt and outputs and over earlier requests' outputs; each round drafts 0..γ tokens per
  sequence, fewer when the matched context is short (``suffix_spec_factor`` x match length).

Every proposal is verified by one target pass with the exact rejection rule, so the output
distribution is the target's whatever the method.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from jaxserve.config import DTYPES
from jaxserve.speculative.suffix_tree import check_suffix_settings
from jaxserve.validation import is_int

METHODS = ("draft_model", "eagle", "ngram", "medusa", "suffix")


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "draft_model"
    num_speculative_tokens: int = 4  # γ: tokens proposed per round
    draft_model: str | None = None  # method "draft_model": zoo name, checkpoint or HF directory; "eagle": its directory
    medusa_heads: str | None = None  # method "medusa": directory of trained heads
    max_ngram: int = 3  # method "ngram": longest / shortest suffix looked up
    min_ngram: int = 1
    # method "suffix": the trees' depth (longest context matched), finished requests whose outputs the
    # global tree keeps (FIFO), draft length <= floor(factor x match length), and the estimated path
    # probability a drafted token needs (SuffixDecoding's defaults: factor 1, probability 0.1)
    suffix_max_depth: int = 32
    suffix_max_cached_requests: int = 256
    suffix_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    # method "draft_model": the draft's Dense dot operands (ModelConfig.matmul_dtype); None: the target's
    # (LLM's matmul_dtype). Only acceptance depends on it, never the output. A small draft can be faster in
    # float32 next to a bf16-matmul target: its tiny one-row dots gain nothing from bf16 but pay its
    # conversions (zoo draft, γ 5 proposal on the Zen 4: 0.342 ms bf16, 0.218 ms float32)
    draft_matmul_dtype: str | None = None
    # method "draft_model": in rounds where every row is greedy, the draft proposes only its vocabulary's
    # draft_vocab_size most frequent tokens, its LM head cut to them (FR-Spec; jaxserve.speculative.draft_vocab), from
    # token_counts.json beside its weights; rounds with a sampled row use the whole head. Exact either way; a
    # smaller, faster greedy draft step (zoo draft, 1024 of 4096: γ 5 proposal 0.222 -> 0.150 ms)
    draft_vocab_size: int | None = None
    # switching speculation off for a step (jaxserve.engine.spec_policy; both off by default, as in vLLM).
    # disable_by_batch_size: while at least this many sequences are running (prefilling ones too), steps run
    # plain (vLLM's speculative_disable_by_batch_size, on its running-queue size). adaptive: a step speculates
    # only while the measured tokens per round row exceed the measured cost of a round over a plain step at its
    # batch size (wall-clock timed here, so single-process only, and which steps speculate varies between runs;
    # the output distribution never does)
    disable_by_batch_size: int | None = None
    adaptive: bool = False

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"SpeculativeConfig.method must be one of {METHODS}, got {self.method!r}")
        if not is_int(self.num_speculative_tokens) or self.num_speculative_tokens < 1:
            raise ValueError(f"SpeculativeConfig.num_speculative_tokens must be an int >= 1, "
                             f"got {self.num_speculative_tokens!r}")
        for name in ("min_ngram", "max_ngram"):
            if not is_int(getattr(self, name)):
                raise ValueError(f"SpeculativeConfig.{name} must be an int, got {getattr(self, name)!r}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"SpeculativeConfig needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, "
                             f"{self.max_ngram}")
        check_suffix_settings("SpeculativeConfig", "suffix_", max_depth=self.suffix_max_depth,
                              max_cached_requests=self.suffix_max_cached_requests,
                              spec_factor=self.suffix_spec_factor, min_token_prob=self.suffix_min_token_prob)
        if self.draft_matmul_dtype is not None and self.draft_matmul_dtype not in DTYPES:
            raise ValueError(f"SpeculativeConfig.draft_matmul_dtype must be None or one of {DTYPES}, "
                             f"got {self.draft_matmul_dtype!r}")
        if self.draft_vocab_size is not None and (not is_int(self.draft_vocab_size)
                                                  or self.draft_vocab_size < 1 or self.method != "draft_model"):
            raise ValueError(f"SpeculativeConfig.draft_vocab_size must be None or an int >= 1 with method "
                             f"'draft_model', got {self.draft_vocab_size!r} with method {self.method!r}")
        if self.disable_by_batch_size is not None and (not is_int(self.disable_by_batch_size)
                                                       or self.disable_by_batch_size < 1):
            raise ValueError(f"SpeculativeConfig.disable_by_batch_size must be None or an int >= 1, "
                             f"got {self.disable_by_batch_size!r}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"SpeculativeConfig.adaptive must be a bool, got {self.adaptive!r}")
        if self.draft_matmul_dtype is not None and self.method != "draft_model":
            raise ValueError(f"SpeculativeConfig.draft_matmul_dtype is for method 'draft_model', got method "
                             f"{self.method!r} (its proposals run in the target's precision)")

    @property
    def gamma(self) -> int:
        return self.num_speculative_tokens

    @classmethod
    def from_json(cls, text: str) -> "SpeculativeConfig":
        """From a JSON object, as vLLM's ``--speculative-config``: ``'{"method": "ngram",
        "num_speculative_tokens": 4}'``. Bad JSON or unknown keys raise ValueError naming them."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative config {text!r} is not valid JSON: {e}") from None
        if not isinstance(fields, dict):
            raise ValueError(f"speculative config must be a JSON object, got {text!r}")
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown speculative config key(s) {unknown}; known: "
                             f"{[f.name for f in dataclasses.fields(cls)]}")
        return cls(**fields)


def check_draft_matches(target_config: Any, draft_config: Any, target_tokenizer=None, draft_tokenizer=None) -> None:
    """ValueError unless the draft shares the target's vocabulary size and (when both have one) tokenizer."""
    if draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"draft vocab_size {draft_config.vocab_size} != target vocab_size "
                         f"{target_config.vocab_size}: the draft must share the target's vocabulary")
    if (target_tokenizer is None) != (draft_tokenizer is None):
        raise ValueError("the draft and the target must both have a tokenizer or both have none")
    if target_tokenizer is not None and _vocab(target_tokenizer) != _vocab(draft_tokenizer):
        raise ValueError("the draft's tokenizer differs from the target's: token ids would not mean the same")


def _vocab(tokenizer) -> dict:
    return tokenizer._hf.get_vocab()  # jaxserve.tokenizer.Tokenizer wraps a tokenizers.Tokenizer


def check_medusa_matches(target_config: Any, heads_config: Any, gamma: int) -> None:
    """ValueError unless the heads fit the target's hidden and vocabulary sizes and γ <= the number of heads."""
    if (heads_config.hidden_size, heads_config.vocab_size) != (target_config.hidden_size, target_config.vocab_size):
        raise ValueError(f"medusa heads expect hidden_size {heads_config.hidden_size} and vocab_size "
                         f"{heads_config.vocab_size}, the target has {target_config.hidden_size} and "
                         f"{target_config.vocab_size}")
    if gamma > heads_config.num_heads:
        raise ValueError(f"num_speculative_tokens {gamma} exceeds the {heads_config.num_heads} medusa heads")


def check_eagle_matches(target_config: Any, draft_config: Any, head_tokens) -> None:
    """ValueError unless an EAGLE draft's layer fits the target (hidden size, vocabulary) and its head's token ids
    are distinct ids of the target's vocabulary."""
    if (draft_config.hidden_size, draft_config.vocab_size) != (target_config.hidden_size, target_config.vocab_size):
        raise ValueError(f"the EAGLE draft expects hidden_size {draft_config.hidden_size} and vocab_size "
                         f"{draft_config.vocab_size}, the target has {target_config.hidden_size} and "
                         f"{target_config.vocab_size}")
    ids = np.asarray(head_tokens)
    if ids.ndim != 1 or ids.size == 0 or len(np.unique(ids)) != ids.size or ids.min() < 0 \
            or ids.max() >= target_config.vocab_size:
        raise ValueError(f"the EAGLE draft's head token ids must be distinct ids in [0, {target_config.vocab_size}), "
                         f"got {ids.size} ids")
