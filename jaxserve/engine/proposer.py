"""What proposes draft tokens for the speculative engine (host-side description, no JAX).

``Proposer.method`` is "draft_model", "ngram", "medusa" or "suffix" (``SpeculativeConfig.method``).
Its state lives in the ``ModelRunner``: the draft model's KV pool (same blocks and block tables as
the target's), Medusa's per-sequence hidden state between steps, or suffix decoding's host trees.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Proposer:
    """``config``/``params``: a draft ``ModelConfig`` or a ``MedusaConfig`` and its weights (none for
    ngram and suffix); ``head``: a draft restricted to its most frequent tokens (``jaxserve.speculative.draft_vocab``)."""
    method: str
    config: Any = None
    params: Any = None
    head: Any = None
