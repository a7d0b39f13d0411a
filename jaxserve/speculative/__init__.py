"""Speculative decoding: exact rejection sampling and draft -> verify -> accept rounds in one while_loop."""
from typing import TYPE_CHECKING

from jaxserve.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DraftHead": "jaxserve.speculative.draft_vocab",
    "EagleDraft": "jaxserve.speculative.eagle",
    "eagle_generate": "jaxserve.speculative.generate",
    "load_eagle": "jaxserve.speculative.eagle",
    "save_eagle": "jaxserve.speculative.eagle",
    "MedusaConfig": "jaxserve.speculative.medusa",
    "RoundInputs": "jaxserve.speculative.round",
    "RoundOutputs": "jaxserve.speculative.round",
    "SpecMetrics": "jaxserve.speculative.metrics",
    "SpeculativeConfig": "jaxserve.speculative.config",
    "expected_acceptance_length": "jaxserve.speculative.metrics",
    "load_heads": "jaxserve.speculative.medusa",
    "medusa_generate": "jaxserve.speculative.generate",
    "medusa_round": "jaxserve.speculative.medusa",
    "ngram_generate": "jaxserve.speculative.generate",
    "ngram_propose": "jaxserve.speculative.ngram",
    "ngram_round": "jaxserve.speculative.ngram",
    "probs_from_logits": "jaxserve.speculative.rejection",
    "rejection_sample": "jaxserve.speculative.rejection",
    "restrict_head": "jaxserve.speculative.draft_vocab",
    "spec_round": "jaxserve.speculative.round",
    "speculative_generate": "jaxserve.speculative.generate",
    "SuffixCache": "jaxserve.speculative.suffix_tree",
    "SuffixTree": "jaxserve.speculative.suffix_tree",
    "suffix_generate": "jaxserve.speculative.generate",
    "suffix_round": "jaxserve.speculative.given_round",
    "summarize": "jaxserve.speculative.metrics",
    "target_only_generate": "jaxserve.speculative.generate",
})

if TYPE_CHECKING:
    from jaxserve.speculative.config import SpeculativeConfig
    from jaxserve.speculative.draft_vocab import DraftHead, restrict_head
    from jaxserve.speculative.eagle import EagleDraft, load_eagle, save_eagle
    from jaxserve.speculative.generate import (eagle_generate, medusa_generate, ngram_generate, speculative_generate,
                                               suffix_generate, target_only_generate)
    from jaxserve.speculative.medusa import MedusaConfig, load_heads, medusa_round
    from jaxserve.speculative.metrics import SpecMetrics, expected_acceptance_length, summarize
    from jaxserve.speculative.ngram import ngram_propose, ngram_round
    from jaxserve.speculative.rejection import probs_from_logits, rejection_sample
    from jaxserve.speculative.round import RoundInputs, RoundOutputs, spec_round
    from jaxserve.speculative.given_round import suffix_round
    from jaxserve.speculative.suffix_tree import SuffixCache, SuffixTree
