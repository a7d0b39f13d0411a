"""What proposes draft tokens for the speculative engine (host-side description, no JAX).

``Proposer.method`` is "draft_model", "eagle", "ngram", "medusa" or "suffix" (``SpeculativeConfig.method``).
Its state lives in the ``ModelRunner``: the draft model's (or EAGLE draft's) KV pool (same blocks and block
tables as the target's), Medusa's and EAGLE's per-sequence hidden state between steps, or suffix decoding's
host trees.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


DRAFT_POOL_METHODS = ("draft_model", "eagle")  # proposers with a KV pool of their own
HIDDEN_METHODS = ("medusa", "eagle")  # proposers that read the target's hidden state before a sequence's last token


@dataclass(frozen=True)
class Proposer:
    """``config``/``params``: a draft ``ModelConfig`` (an EAGLE draft's: one layer) or a ``MedusaConfig`` and its
    weights (none for ngram and suffix); ``head``: a draft restricted to its most frequent tokens
    (``jaxserve.speculative.draft_vocab``); for EAGLE the token ids i32[N] of the target head's columns it drafts
    from in greedy rounds (the runner cuts the target's head to them)."""
    method: str
    config: Any = None
    params: Any = None
    head: Any = None
