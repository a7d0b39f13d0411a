"""Speculative decoding: exact rejection sampling and draft -> verify -> accept rounds in one while_loop."""
from jaxserve.spec.generate import speculative_generate, target_only_generate
from jaxserve.spec.metrics import SpecMetrics, expected_acceptance_length, summarize
from jaxserve.spec.rejection import probs_from_logits, rejection_sample
from jaxserve.spec.round import RoundInputs, RoundOutputs, spec_round

__all__ = ["speculative_generate", "target_only_generate", "SpecMetrics", "expected_acceptance_length", "summarize",
           "probs_from_logits", "rejection_sample", "RoundInputs", "RoundOutputs", "spec_round"]
