"""Measuring speculative decoding against the target-only baseline in the same process.

Each point compiles its program with one untimed call, then times ``repeats`` calls (to
``block_until_ready``) and keeps the median. Acceptance figures come from the last timed call.
"""
from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from jaxserve.spec.generate import ngram_generate, speculative_generate, target_only_generate
from jaxserve.spec.metrics import expected_acceptance_length, summarize


def _timed(call, repeats: int):
    jax.block_until_ready(call())  # compile + warm
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def measure_point(target, draft, prompts: np.ndarray, lens: np.ndarray, *, gammas, temperature: float,
                  max_tokens: int, eos_token_id: int | None, repeats: int, block_size: int = 16,
                  seed: int = 0, method: str = "draft_model") -> list[dict]:
    """Baseline plus one row per γ for one (batch, temperature); target/draft are (config, params).

    method: "draft_model" (draft proposes) or "ngram" (prompt lookup; draft unused).
    """
    if method not in ("draft_model", "ngram"):
        raise ValueError(f"method must be 'draft_model' or 'ngram', got {method!r}")
    (tcfg, tparams), (dcfg, dparams) = target, draft
    b = len(prompts)
    common = dict(max_tokens=max_tokens, temperature=temperature, seeds=np.arange(b) + seed,
                  eos_token_id=eos_token_id, block_size=block_size)
    base_s, (_, base_n, _) = _timed(lambda: target_only_generate(tparams, tcfg, prompts, lens, **common), repeats)
    base_tps = int(np.sum(base_n)) / base_s
    rows = []
    for gamma in gammas:
        if method == "ngram":
            call = lambda: ngram_generate(tparams, tcfg, prompts, lens, gamma=gamma, **common)  # noqa: E731
        else:
            call = lambda: speculative_generate(tparams, tcfg, dparams, dcfg, prompts, lens,  # noqa: E731
                                                gamma=gamma, **common)
        spec_s, (_, n, metrics) = _timed(call, repeats)
        s = summarize(metrics)
        alpha = s["token_acceptance_prob"]
        theory = expected_acceptance_length(alpha, gamma)
        tps = int(np.sum(n)) / spec_s
        rows.append({"method": method, "batch": b, "temperature": temperature, "gamma": gamma, **s,
                     "theory_acceptance_length": theory,
                     "acceptance_length_vs_theory": s["mean_acceptance_length"] / theory - 1,
                     "spec_seconds": spec_s, "spec_tokens_per_s": tps,
                     "baseline_seconds": base_s, "baseline_tokens_per_s": base_tps, "speedup": tps / base_tps})
    return rows
