"""Measuring speculative decoding against the target-only baseline in the same process.

Each point compiles its program with one untimed call, then times ``repeats`` calls (to
``block_until_ready``) and keeps the fastest: on a shared CPU, interference only ever slows a call
down (batch-1 points, ~60-90 ms each, moved by +-30% between calls), and baseline and speculative
runs get the same estimator. Acceptance figures come from the last timed call.
``measure_point`` times the jitted while-loop generators; ``measure_engine_point`` the engine
(``LLM.generate`` under continuous batching, one round per step) against a plain engine.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from jaxserve.spec.generate import medusa_generate, ngram_generate, speculative_generate, target_only_generate
from jaxserve.spec.metrics import expected_acceptance_length, summarize


def _timed(call, repeats: int):
    jax.block_until_ready(call())  # compile + warm
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return min(times), out


def measure_point(target, draft, prompts: np.ndarray, lens: np.ndarray, *, gammas, temperature: float,
                  max_tokens: int, eos_token_id: int | None, repeats: int, block_size: int = 16,
                  seed: int = 0, method: str = "draft_model") -> list[dict]:
    """Baseline plus one row per γ for one (batch, temperature); target/draft are (config, params).

    method: "draft_model" (draft proposes), "ngram" (prompt lookup; draft unused) or "medusa"
    (draft is (MedusaConfig, heads params)).
    """
    if method not in ("draft_model", "ngram", "medusa"):
        raise ValueError(f"method must be 'draft_model', 'ngram' or 'medusa', got {method!r}")
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
        elif method == "medusa":
            call = lambda: medusa_generate(tparams, tcfg, dparams, dcfg, prompts, lens,  # noqa: E731
                                           gamma=gamma, **common)
        else:
            call = lambda: speculative_generate(tparams, tcfg, dparams, dcfg, prompts, lens,  # noqa: E731
                                                gamma=gamma, **common)
        spec_s, (_, n, metrics) = _timed(call, repeats)
        s = summarize(metrics)
        rows.append(_row("generate", method, b, temperature, gamma, s, int(np.sum(n)) / spec_s, spec_s,
                         base_tps, base_s))
    return rows


def _row(path, method, batch, temperature, gamma, s, tps, seconds, base_tps, base_seconds) -> dict:
    theory = expected_acceptance_length(s["token_acceptance_prob"], gamma)
    return {"path": path, "method": method, "batch": batch, "temperature": temperature, "gamma": gamma, **s,
            "theory_acceptance_length": theory,
            "acceptance_length_vs_theory": s["mean_acceptance_length"] / theory - 1,
            "spec_seconds": seconds, "spec_tokens_per_s": tps,
            "baseline_seconds": base_seconds, "baseline_tokens_per_s": base_tps, "speedup": tps / base_tps}


def _engine_seconds(llm, prompts, params, repeats: int):
    llm.generate(prompts, params, use_tqdm=False)  # compile + warm
    if llm.engine.spec_runner is not None:
        llm.engine.spec_runner.reset_metrics()  # acceptance over the timed calls only
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return min(times), sum(len(o.outputs[0].token_ids) for o in outs)


def measure_engine_point(target, proposers: dict, prompts: np.ndarray, *, gammas, temperature: float,
                         max_tokens: int, repeats: int, engine_kwargs: dict, seed: int = 0) -> list[dict]:
    """The engine path: ``LLM.generate`` of the prompts (all submitted at once) with one speculative round
    per step, against a plain engine over the same target. target: (config, params); proposers: method ->
    proposer weights for ``LLM.from_params(draft=...)`` (None for ngram). Acceptance figures are the
    spec engine's ``stats()`` over its timed calls."""
    from jaxserve import LLM, SamplingParams, SpeculativeConfig

    tcfg, tparams = target
    prompts = [list(map(int, p)) for p in prompts]
    params = [SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i, ignore_eos=True)
              for i in range(len(prompts))]
    kw = {"max_num_seqs": len(prompts), **engine_kwargs}
    base_s, base_n = _engine_seconds(LLM.from_params(tcfg, tparams, **kw), prompts, params, repeats)
    rows = []
    for method, weights in proposers.items():
        for gamma in gammas:
            spec = SpeculativeConfig(method=method, num_speculative_tokens=gamma)
            llm = LLM.from_params(tcfg, tparams, speculative=spec, draft=weights, **kw)
            spec_s, n = _engine_seconds(llm, prompts, params, repeats)
            st = llm.stats()
            s = {k[len("spec_"):]: v for k, v in st.items() if k.startswith("spec_")}
            rows.append(_row("engine", method, len(prompts), temperature, gamma, s, n / spec_s, spec_s,
                             base_n / base_s, base_s))
    return rows
