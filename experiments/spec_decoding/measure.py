"""Measuring speculative decoding against the target-only baseline in the same process.

Each point compiles its program with one untimed call, then times ``repeats`` calls (to
``block_until_ready``) of the speculative program and as many of the baseline, alternating, and
keeps the fastest of each: on a shared CPU, interference only ever slows a call down (batch-1
points, ~60-90 ms each, moved by +-30% between calls), and the machine's speed drifts by ~15%
within half an hour, so each speculative row is compared with a baseline timed in the same
minute, not with one taken at the start of the sweep. Acceptance figures come from the last
timed call.

A point may cover several prompt sets (prompts i32[S, B, L]), so a batch-1 point's α and speedup
are not those of a single prompt (they moved by several percent between prompts with the same
draft). Each set is its own timed call (base set 0, spec set 0, base set 1, ...) and a side's
time is the sum over sets of each set's fastest call: the fastest of a call covering all S sets
was itself ~S times as likely to include a slow stretch (γ 5 and γ 7 swapped 1.98x / 1.76x to
1.84x / 2.07x between two runs that way).
``measure_point`` times the jitted while-loop generators; ``measure_engine_point`` the engine
(``LLM.generate`` under continuous batching, one round per step) against a plain engine.

Each row has two speedups. ``speedup``: tokens per second of whole calls (prefill included), the
end-to-end figure. ``decode_speedup``: tokens after each row's first per second of the time after it,
where that time is a call's minus a prefill-only call's (max_tokens 1, timed in the same alternation):
the decode phase alone, what TPOT / inter-token latency compares. With 64-token prompts and 64 new
tokens a prefill is ~11% of a batch-1 baseline call, so the two differ noticeably here. The speculative
side's prefill-only call uses the point's smallest γ (its prefill does not depend on γ; one compile per point,
not per γ, and none of its own when that γ is timed too: max_tokens is an argument of the program, not static).
"""
from __future__ import annotations

import time

import jax
import numpy as np

from jaxserve.speculative.generate import (medusa_generate, ngram_generate, speculative_generate, suffix_generate,
                                           target_only_generate)
from jaxserve.speculative.metrics import SpecMetrics, expected_acceptance_length, summarize


def _interleaved(calls: dict, repeats: int, after_warmup=None) -> dict:
    """name -> (fastest seconds, output of its last call): each call once untimed (compile + warm),
    then ``after_warmup()`` if given, then ``repeats`` rounds that time every call once, in turn."""
    out = {name: jax.block_until_ready(call()) for name, call in calls.items()}
    if after_warmup is not None:
        after_warmup()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            out[name] = jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    return {name: (min(times[name]), out[name]) for name in calls}


def _prompt_sets(prompts: np.ndarray) -> np.ndarray:
    """i32[B, L] (one set) or i32[S, B, L] -> i32[S, B, L]."""
    prompts = np.asarray(prompts)
    if prompts.ndim not in (2, 3):
        raise ValueError(f"prompts must be i32[B, L] or i32[S, B, L] (S prompt sets), got shape {prompts.shape}")
    return prompts[None] if prompts.ndim == 2 else prompts


def _per_set(generate, sets: np.ndarray, lens: np.ndarray, seed: int) -> list:
    """One call per prompt set: ``generate(prompts, lens, seeds)`` with seeds unique across sets."""
    b = sets.shape[1]
    return [lambda i=i: generate(sets[i], lens[i], seed + i * b + np.arange(b)) for i in range(len(sets))]


def _timed_sets(sides: dict, repeats: int, after_warmup=None) -> dict:
    """side -> (seconds summed over sets of each set's fastest call, [its last output per set]);
    sides: name -> ``_per_set`` calls, timed interleaved set by set (``_interleaved``)."""
    num_sets = len(next(iter(sides.values())))
    timed = _interleaved({(name, i): calls[i] for i in range(num_sets) for name, calls in sides.items()}, repeats,
                         after_warmup)
    return {name: (sum(timed[name, i][0] for i in range(num_sets)), [timed[name, i][1] for i in range(num_sets)])
            for name in sides}


def _merge(outs: list) -> tuple[int, SpecMetrics]:
    """(tokens generated, metrics of every row of every set) from each set's generate output."""
    metrics = jax.tree.map(lambda *x: np.concatenate([np.asarray(a) for a in x]), *[m for _, _, m in outs])
    return sum(int(np.sum(n)) for _, n, _ in outs), metrics


def _decode_speedup(spec_n: int, spec_s: float, spec_prefill_s: float, base_n: int, base_s: float,
                    base_prefill_s: float, rows: int) -> float:
    """Speedup of the decode phase: tokens after each of ``rows`` rows' first per second after the prefill
    (NaN when noise leaves no time or no tokens after it, e.g. a smoke run's few tokens)."""
    spec_t, base_t = spec_s - spec_prefill_s, base_s - base_prefill_s
    if min(spec_t, base_t) <= 0 or min(spec_n, base_n) <= rows:
        return float("nan")
    return ((spec_n - rows) / spec_t) / ((base_n - rows) / base_t)


def measure_point(target, draft, prompts: np.ndarray, lens: np.ndarray, *, gammas, temperature: float,
                  max_tokens: int, eos_token_id: int | None, repeats: int, block_size: int = 16,
                  seed: int = 0, method: str = "draft_model", draft_head=None) -> list[dict]:
    """Baseline plus one row per γ for one (batch, temperature); target/draft are (config, params, ...).

    prompts: i32[B, L], or i32[S, B, L] for S sets of B, each timed on its own and the sets' times
    summed (lens i32[B] or i32[S, B] alike). method: "draft_model" (draft proposes), "ngram" (prompt
    lookup; draft unused), "suffix" (suffix trees on the host; draft unused) or "medusa" (draft is
    (MedusaConfig, heads params)). draft_head: the draft restricted
    to some tokens (``jaxserve.speculative.draft_vocab``).
    """
    if method not in ("draft_model", "ngram", "medusa", "suffix"):
        raise ValueError(f"method must be 'draft_model', 'ngram', 'medusa' or 'suffix', got {method!r}")
    (tcfg, tparams), (dcfg, dparams) = target, draft[:2]
    sets = _prompt_sets(prompts)
    lens = np.broadcast_to(np.asarray(lens).reshape(-1, sets.shape[1]), sets.shape[:2])
    b = sets.shape[1]
    common = dict(temperature=temperature, eos_token_id=eos_token_id, block_size=block_size)

    def baseline(tokens):
        return _per_set(lambda p, n, seeds: target_only_generate(tparams, tcfg, p, n, seeds=seeds, max_tokens=tokens,
                                                                 **common), sets, lens, seed)

    def speculative(gamma, tokens):
        kw = dict(gamma=gamma, max_tokens=tokens, **common)

        def gen(p, n, seeds):
            if method == "ngram":
                return ngram_generate(tparams, tcfg, p, n, seeds=seeds, **kw)
            if method == "suffix":  # a fresh cache per call: no call drafts from an earlier call's outputs
                return suffix_generate(tparams, tcfg, p, n, seeds=seeds, **kw)
            if method == "medusa":
                return medusa_generate(tparams, tcfg, dparams, dcfg, p, n, seeds=seeds, **kw)
            return speculative_generate(tparams, tcfg, dparams, dcfg, p, n, seeds=seeds, draft_head=draft_head, **kw)
        return _per_set(gen, sets, lens, seed)

    # the prefill-only call runs the program of the smallest γ timed (the grids start at γ 1): compiled once for both
    first_gamma = min(gammas, default=1)
    sides = {"base": baseline(max_tokens), "base_prefill": baseline(1), "spec_prefill": speculative(first_gamma, 1)}
    rows = []
    for gamma in gammas:
        timed = _timed_sets({**sides, "spec": speculative(gamma, max_tokens)}, repeats)
        (base_s, base_outs), (spec_s, spec_outs) = timed["base"], timed["spec"]
        (base_n, _), (n, metrics) = _merge(base_outs), _merge(spec_outs)
        decode = _decode_speedup(n, spec_s, timed["spec_prefill"][0], base_n, base_s, timed["base_prefill"][0],
                                 rows=sets.shape[0] * b)
        rows.append(_row("generate", method, b, temperature, gamma, summarize(metrics), n / spec_s, spec_s,
                         base_n / base_s, base_s, prompts=sets.shape[0] * b, decode_speedup=decode))
    return rows


def _row(path, method, batch, temperature, gamma, s, tps, seconds, base_tps, base_seconds, prompts,
         decode_speedup) -> dict:
    theory = expected_acceptance_length(s["token_acceptance_prob"], gamma)
    return {"path": path, "method": method, "batch": batch, "prompts": prompts, "temperature": temperature,
            "gamma": gamma, **s,
            "theory_acceptance_length": theory,
            "acceptance_length_vs_theory": s["mean_acceptance_length"] / theory - 1,
            "spec_seconds": seconds, "spec_tokens_per_s": tps,
            "baseline_seconds": base_seconds, "baseline_tokens_per_s": base_tps, "speedup": tps / base_tps,
            "decode_speedup": decode_speedup}


def _engine_calls(llm, prompt_sets: list, params: list) -> list:
    """One call per prompt set for ``_timed_sets``, each returning its rows' generated token ids."""
    def call(i):
        return [tuple(o.outputs[0].token_ids) for o in llm.generate(prompt_sets[i], params[i], use_tqdm=False)]
    return [lambda i=i: call(i) for i in range(len(prompt_sets))]


def measure_engine_point(target, proposers: dict, prompts: np.ndarray, *, gammas, temperature: float,
                         max_tokens: int, repeats: int, engine_kwargs: dict, seed: int = 0,
                         draft_vocab_size: int | None = None, lens: np.ndarray | None = None,
                         policies=("none",), suffix_spec_factor: float = 1.0, ignore_eos: bool = True) -> list[dict]:
    """The engine path: ``LLM.generate`` of each set of B prompts (i32[B, L], or i32[S, B, L] for S
    sets timed one by one as in ``measure_point``) with one speculative round per step, against a
    plain engine over the same target. target: (config, params); proposers: method -> proposer
    weights for ``LLM.from_params(draft=...)`` (None for ngram); ``draft_vocab_size`` applies to draft_model
    (its weights then carry the tokenizer and token counts). Acceptance figures are the spec engine's
    ``stats()`` over its timed calls. ``lens`` (i32[B] or i32[S, B]): each prompt's length, the rest of
    its row padding (None: whole rows). ``policies``: the speculation policy of each row ("none", "adaptive",
    "by_batch:N"; ``engine_policy``); a row's ``plain_steps`` / ``speculative_steps`` count the policy's choices.
    ``suffix_spec_factor``: suffix decoding's drafts reach at most this times the matched context's length
    (``SpeculativeConfig.suffix_spec_factor``). ``ignore_eos=False``: requests stop at EOS (greedy: both sides
    emit the same tokens, so the same work)."""
    from jaxserve import LLM, SamplingParams

    tcfg, tparams = target
    sets = _prompt_sets(prompts)
    num_sets, batch = sets.shape[:2]
    lens = np.full((num_sets, batch), sets.shape[2]) if lens is None else np.asarray(lens).reshape(num_sets, batch)
    prompt_sets = [[list(map(int, p[:n])) for p, n in zip(prompts, ns)] for prompts, ns in zip(sets, lens)]
    def params(tokens):
        return [[SamplingParams(max_tokens=tokens, temperature=temperature, seed=seed + i * batch + j,
                                ignore_eos=ignore_eos) for j in range(batch)] for i in range(num_sets)]

    kw = {"max_num_seqs": batch, **engine_kwargs}
    plain = LLM.from_params(tcfg, tparams, **kw)
    baseline = {"base": _engine_calls(plain, prompt_sets, params(max_tokens)),
                "base_prefill": _engine_calls(plain, prompt_sets, params(1))}
    rows = []
    for method, weights in proposers.items():
        for gamma in gammas:
            for policy in policies:
                rows.append(_engine_row(target, method, weights, gamma, policy, kw, baseline, prompt_sets, params,
                                        max_tokens, repeats, batch, temperature, draft_vocab_size,
                                        suffix_spec_factor))
    return rows


def engine_policy(policy: str) -> dict:
    """``SpeculativeConfig`` fields of a policy name: "none", "adaptive" or "by_batch:N"."""
    if policy == "none":
        return {}
    if policy == "adaptive":
        return {"adaptive": True}
    if policy.startswith("by_batch:") and policy[len("by_batch:"):].isdigit():
        return {"disable_by_batch_size": int(policy[len("by_batch:"):])}
    raise ValueError(f"engine policy must be 'none', 'adaptive' or 'by_batch:N', got {policy!r}")


def _engine_row(target, method, weights, gamma, policy, kw, baseline, prompt_sets, params, max_tokens, repeats,
                batch, temperature, draft_vocab_size, suffix_spec_factor) -> dict:
    from jaxserve import LLM, SpeculativeConfig

    tcfg, tparams = target
    num_sets = len(prompt_sets)
    # suffix decoding without its global tree: every timed call repeats the same prompts, and would
    # draft from the previous call's (greedy: identical) outputs
    spec = SpeculativeConfig(method=method, num_speculative_tokens=gamma,
                             draft_vocab_size=draft_vocab_size if method == "draft_model" else None,
                             suffix_max_cached_requests=0, suffix_spec_factor=suffix_spec_factor,
                             **engine_policy(policy))
    llm = LLM.from_params(tcfg, tparams, speculative=spec, draft=weights, **kw)
    # its own engine (same jitted programs), so that llm.stats() counts only the full calls
    prefill_only = LLM.from_params(tcfg, tparams, speculative=spec, draft=weights, **kw)
    sides = {**baseline, "spec_prefill": _engine_calls(prefill_only, prompt_sets, params(1)),
             "spec": _engine_calls(llm, prompt_sets, params(max_tokens))}

    def reset():  # the policy keeps what the untimed calls taught it (a serving engine would); the counts restart
        llm.engine.spec_stats.reset()
        if llm.engine.spec_policy is not None:
            llm.engine.spec_policy.counts.update(speculative_steps=0, plain_steps=0)

    timed = _timed_sets(sides, repeats, after_warmup=reset)
    (base_s, base_n), (spec_s, n) = [(t, sum(len(r) for rows in outs for r in rows))
                                     for t, outs in (timed["base"], timed["spec"])]
    decode = _decode_speedup(n, spec_s, timed["spec_prefill"][0], base_n, base_s, timed["base_prefill"][0],
                             rows=num_sets * batch)
    st = llm.stats()
    s = {k[len("spec_"):]: v for k, v in st.items() if k.startswith("spec_")}
    row = _row("engine", method, batch, temperature, gamma, s, n / spec_s, spec_s, base_n / base_s, base_s,
               prompts=num_sets * batch, decode_speedup=decode)
    # greedy: the speculative engine's tokens must be the plain engine's (None when sampling: other draws)
    same = timed["spec"][1] == timed["base"][1] if temperature == 0 else None
    return {**row, "policy": policy, "greedy_identical": same}
