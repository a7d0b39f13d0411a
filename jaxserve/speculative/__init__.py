"""Speculative decoding: exact rejection sampling and draft -> verify -> accept rounds in one while_loop."""
from jaxserve.speculative.config import SpeculativeConfig
from jaxserve.speculative.draft_vocab import DraftHead, restrict_head
from jaxserve.speculative.generate import medusa_generate, ngram_generate, speculative_generate, target_only_generate
from jaxserve.speculative.medusa import MedusaConfig, load_heads, medusa_round
from jaxserve.speculative.metrics import SpecMetrics, expected_acceptance_length, summarize
from jaxserve.speculative.ngram import ngram_propose, ngram_round
from jaxserve.speculative.rejection import probs_from_logits, rejection_sample
from jaxserve.speculative.round import RoundInputs, RoundOutputs, spec_round

__all__ = ["speculative_generate", "target_only_generate", "ngram_generate", "medusa_generate", "SpeculativeConfig",
           "MedusaConfig", "load_heads", "medusa_round", "SpecMetrics",
           "expected_acceptance_length", "summarize", "ngram_propose", "ngram_round", "probs_from_logits",
           "rejection_sample", "RoundInputs", "RoundOutputs", "spec_round", "DraftHead", "restrict_head"]
