"""Speculative decoding: exact rejection sampling and draft -> verify -> accept rounds in one while_loop."""
from jaxserve.spec.config import SpeculativeConfig
from jaxserve.spec.draft_vocab import DraftHead, restrict_head
from jaxserve.spec.generate import medusa_generate, ngram_generate, speculative_generate, target_only_generate
from jaxserve.spec.medusa import MedusaConfig, load_heads, medusa_round
from jaxserve.spec.metrics import SpecMetrics, expected_acceptance_length, summarize
from jaxserve.spec.ngram import ngram_propose, ngram_round
from jaxserve.spec.rejection import probs_from_logits, rejection_sample
from jaxserve.spec.round import RoundInputs, RoundOutputs, spec_round

__all__ = ["speculative_generate", "target_only_generate", "ngram_generate", "medusa_generate", "SpeculativeConfig",
           "MedusaConfig", "load_heads", "medusa_round", "SpecMetrics",
           "expected_acceptance_length", "summarize", "ngram_propose", "ngram_round", "probs_from_logits",
           "rejection_sample", "RoundInputs", "RoundOutputs", "spec_round", "DraftHead", "restrict_head"]
