"""A draft model against its target on held-out prompts: decode-step cost ratio, acceptance, and speedup.

    nice -n 19 python scripts/draft_speedup.py target=smollm2-135m-instruct \
        draft=jaxserve/smollm2-135m-instruct-draft prompts=runs/onpolicy/smollm2_heldout.json out=/tmp/d.json

All in one process, on the while-loop path (``jaxserve.speculative.generate``):

- ``cost``: one batch-1 decode step of each model, from ``target_only_generate`` with max_tokens
  ``long`` minus ``short`` (EOS ignored), so prefill and the call cancel; the two models alternate,
  ``repeats`` times, median and range.
- ``acceptance``: ``speculative_generate`` over ``alpha_prompts`` held-out prompts (batches of 8), γ in
  ``gammas``, T = 0 and 1, stopping at EOS: α (``token_acceptance_prob``), mean accepted length.
- ``speedup``: batch 1, greedy, ``speed_prompts`` prompts; per repeat and prompt target-only then each γ,
  alternating; the median over repeats of the summed wall time per method; outputs checked identical.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np

from jaxserve.config import apply_overrides


@dataclasses.dataclass(frozen=True)
class DraftSpeedupConfig:
    target: str = "smollm2-135m-instruct"
    draft: str = "jaxserve/smollm2-135m-instruct-draft"
    prompts: str = "runs/onpolicy/smollm2_heldout.json"  # [{"kind", "ids"}], from scripts/onpolicy_chat.py
    gammas: tuple = (2, 4)
    alpha_prompts: int = 16
    speed_prompts: int = 2
    max_tokens: int = 64
    repeats: int = 5
    short: int = 8  # cost: decode steps of the short and long calls
    long: int = 72
    out: str = ""


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    np.asarray(out[0])  # block until the device is done
    return time.perf_counter() - t0, out


def _stats(xs) -> dict:
    return {"median": float(np.median(xs)), "min": float(np.min(xs)), "max": float(np.max(xs)), "n": len(xs)}


def _pad(rows: list[list[int]]):
    lens = np.array([len(r) for r in rows], np.int32)
    ids = np.zeros((len(rows), int(lens.max())), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return ids, lens


def decode_step_cost(models: dict, prompt: list[int], cfg: DraftSpeedupConfig) -> dict:
    """Seconds per batch-1 decode step of each model (long minus short call, divided by the step difference)."""
    from jaxserve.speculative.generate import target_only_generate

    ids, lens = _pad([prompt])
    run = {k: (lambda n, c=c, p=p: target_only_generate(p, c, ids, lens, max_tokens=n)) for k, (c, p) in models.items()}
    for f in run.values():  # compile both lengths
        f(cfg.short), f(cfg.long)
    steps = {k: [] for k in run}
    for _ in range(cfg.repeats):
        for k, f in run.items():
            steps[k].append((_timed(lambda: f(cfg.long))[0] - _timed(lambda: f(cfg.short))[0]) / (cfg.long - cfg.short))
    (t, tk), (d, dk) = list(steps.items())
    ratios = np.array(steps[d]) / np.array(steps[t])
    return {f"{t}_step_ms": _stats(np.array(steps[t]) * 1e3), f"{d}_step_ms": _stats(np.array(steps[d]) * 1e3),
            "ratio": _stats(ratios)}


def acceptance(tgt, drf, prompts, cfg: DraftSpeedupConfig, eos: int) -> dict:
    """Summed SpecMetrics summaries per (γ, temperature) over the prompts, batches of 8."""
    import jax
    from jaxserve.speculative.generate import speculative_generate
    from jaxserve.speculative.metrics import expected_acceptance_length, summarize

    out = {}
    for gamma in cfg.gammas:
        for temp in (0.0, 1.0):
            total = None
            for lo in range(0, len(prompts), 8):
                ids, lens = _pad(prompts[lo:lo + 8])
                _, _, m = speculative_generate(*tgt, *drf, ids, lens, gamma=gamma, max_tokens=cfg.max_tokens,
                                               temperature=temp, seeds=lo + np.arange(len(lens)), eos_token_id=eos)
                m = jax.tree.map(np.asarray, m)
                total = m if total is None else jax.tree.map(lambda a, b: np.concatenate([a, b]), total, m)
            s = summarize(total)
            s["theory_length"] = expected_acceptance_length(s["token_acceptance_prob"], gamma)
            out[f"gamma{gamma}_T{temp:g}"] = s
    return out


def speedup(tgt, drf, prompts, cfg: DraftSpeedupConfig, eos: int) -> dict:
    """Batch-1 greedy wall time, target-only vs each γ, alternating; greedy outputs must match exactly."""
    from jaxserve.speculative.generate import speculative_generate, target_only_generate

    calls = {"target": lambda ids, lens: target_only_generate(*tgt, ids, lens, max_tokens=cfg.max_tokens,
                                                              eos_token_id=eos)}
    for g in cfg.gammas:
        calls[f"gamma{g}"] = lambda ids, lens, g=g: speculative_generate(*tgt, *drf, ids, lens, gamma=g,
                                                                         max_tokens=cfg.max_tokens, eos_token_id=eos)
    inputs = [_pad([p]) for p in prompts]
    ref = {}
    for name, f in calls.items():  # compile, and check exactness
        for i, (ids, lens) in enumerate(inputs):
            toks, n, _ = f(ids, lens)
            got = np.asarray(toks)[0, :int(np.asarray(n)[0])].tolist()
            ref.setdefault(i, got)
            if got != ref[i]:
                raise AssertionError(f"{name} differs from target-only on prompt {i}: {got} vs {ref[i]}")
    wall = {k: [] for k in calls}
    for _ in range(cfg.repeats):
        for name, f in calls.items():
            wall[name].append(sum(_timed(lambda: f(ids, lens))[0] for ids, lens in inputs))
    tokens = sum(len(v) for v in ref.values())
    out = {"tokens": tokens, "target_tok_s": _stats(tokens / np.array(wall["target"]))}
    for name in calls:
        if name != "target":
            out[name] = {"wall_s": _stats(wall[name]), "speedup": _stats(np.array(wall["target"]) / np.array(wall[name]))}
    out["target"] = {"wall_s": _stats(wall["target"])}
    return out


def main(argv: list[str]) -> None:
    from jaxserve.models.loading import resolve_model

    cfg = apply_overrides(DraftSpeedupConfig(), argv)
    tcfg, tparams, tok = resolve_model(cfg.target)
    dcfg, dparams, _ = resolve_model(cfg.draft)
    held = json.loads(pathlib.Path(cfg.prompts).read_text())
    chat = [p["ids"] for p in held if p["kind"] == "chat"]
    res = {"config": dataclasses.asdict(cfg), "loadavg_start": os.getloadavg()}
    res["cost"] = decode_step_cost({"target": (tcfg, tparams), "draft": (dcfg, dparams)}, chat[0], cfg)
    print(json.dumps(res["cost"]), flush=True)
    res["acceptance"] = acceptance((tparams, tcfg), (dparams, dcfg), [p["ids"] for p in held][:cfg.alpha_prompts],
                                   cfg, tok.eos_token_id)
    print(json.dumps({k: (v["token_acceptance_prob"], v["mean_acceptance_length"]) for k, v in res["acceptance"].items()}),
          flush=True)
    res["speedup"] = speedup((tparams, tcfg), (dparams, dcfg), chat[:cfg.speed_prompts], cfg, tok.eos_token_id)
    res["loadavg_end"] = os.getloadavg()
    print(json.dumps(res["speedup"]), flush=True)
    if cfg.out:
        pathlib.Path(cfg.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
