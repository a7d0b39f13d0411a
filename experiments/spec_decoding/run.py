"""Speculative decoding vs target-only decoding: α, acceptance length vs theory, target calls, speedup.

    python experiments/spec_decoding/run.py [key=value ...]
    python experiments/spec_decoding/run.py target=preset:tiny-code draft=preset:tiny-code-draft \\
        gammas=[1,3] batches=[1,4] max_tokens=32 prompt_len=16 repeats=1 smoke=true   # smoke run

Writes results.json and RESULTS.md into cfg.out_dir (smoke runs: smoke_results.json, SMOKE.md).
"""
import datetime
import json
import os
import shlex
import sys

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # this checkout's jaxserve, whatever is installed
from config import get_config  # noqa: E402

from jaxserve.config import apply_overrides  # noqa: E402
from jaxserve.models import get_preset, init_params  # noqa: E402
from jaxserve.models.loading import resolve_model  # noqa: E402
from jaxserve.spec.benchmark import measure_point  # noqa: E402

PRESET = "preset:"


def load(name: str, seed: int):
    """(config, params, tokenizer or None); presets get random weights."""
    if name.startswith(PRESET):
        config = get_preset(name[len(PRESET):])
        return config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(seed)), None
    return resolve_model(name)


def make_prompts(cfg, tokenizer, vocab: int, batch: int) -> np.ndarray:
    rng = np.random.default_rng(cfg.seed + batch)
    if tokenizer is None:
        return rng.integers(0, vocab, (batch, cfg.prompt_len))
    from jaxserve.train.data import encode_split
    stream = encode_split(tokenizer, None, "val", max_tokens=200_000)
    starts = rng.integers(0, len(stream) - cfg.prompt_len, batch)
    return np.stack([stream[s:s + cfg.prompt_len] for s in starts])


def measure(cfg):
    tcfg, tparams, tok = load(cfg.target, cfg.seed)
    dcfg, dparams, _ = load(cfg.draft, cfg.seed + 1) if cfg.method == "draft_model" else (None, None, None)
    eos = None if cfg.ignore_eos else tcfg.eos_token_id
    rows = []
    for temperature in cfg.temperatures:
        for batch in cfg.batches:
            prompts = make_prompts(cfg, tok, tcfg.vocab_size, batch)
            lens = np.full(batch, cfg.prompt_len)
            rows += measure_point((tcfg, tparams), (dcfg, dparams), prompts, lens, gammas=cfg.gammas,
                                  temperature=temperature, max_tokens=cfg.max_tokens, eos_token_id=eos,
                                  repeats=cfg.repeats, block_size=cfg.block_size, seed=cfg.seed,
                                  method=cfg.method)
            print(json.dumps({k: rows[-1][k] for k in ("temperature", "batch", "gamma", "speedup")}), flush=True)
    return rows


def markdown(rows, meta):
    kind = "SMOKE RUN (random weights: figures exercise the code, they are not results)" if meta["smoke"] \
        else "results"
    proposer = meta["draft"] + " drafting" if meta["method"] == "draft_model" else "n-gram prompt lookup"
    lines = [f"# Speculative decoding: {meta['target']} verified, {proposer} ({kind})", "",
             f"Command: `{meta['command']}`  ",
             f"Date: {meta['date']}; JAX {meta['jax_version']} ({meta['backend']}); load average at start "
             f"{meta['loadavg_start']}, at end {meta['loadavg_end']}; prompts {meta['prompt_len']} tokens, "
             f"{meta['max_tokens']} generated per row, median of {meta['repeats']} timed calls.", "",
             "α = accepted / reached (Leviathan's per-token α); vLLM's rate = accepted / drafted; "
             "length = 1 + accepted / rounds; theory = (1 - α^(γ+1)) / (1 - α); calls/tok = target "
             "forward passes (prefill included) per generated token; speedup = tokens/s over target-only "
             "decoding of the same prompts in the same run.", "",
             "| T | batch | γ | α | vLLM rate | length | theory | Δ | calls/tok | spec tok/s | base tok/s | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['temperature']:g} | {r['batch']} | {r['gamma']} | {r['token_acceptance_prob']:.3f} | "
                     f"{r['acceptance_rate']:.3f} | {r['mean_acceptance_length']:.2f} | "
                     f"{r['theory_acceptance_length']:.2f} | {100 * r['acceptance_length_vs_theory']:+.1f}% | "
                     f"{r['target_calls_per_token']:.3f} | {r['spec_tokens_per_s']:.0f} | "
                     f"{r['baseline_tokens_per_s']:.0f} | {r['speedup']:.2f}x |")
    lines += ["", "Best γ per (temperature, batch):", ""]
    for key in dict.fromkeys((r["temperature"], r["batch"]) for r in rows):
        best = max((r for r in rows if (r["temperature"], r["batch"]) == key), key=lambda r: r["speedup"])
        lines.append(f"- T={key[0]:g}, batch {key[1]}: γ={best['gamma']}, {best['speedup']:.2f}x")
    return "\n".join(lines) + "\n"


def main(argv):
    cfg = apply_overrides(get_config(), argv)
    load_start = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = measure(cfg)
    meta = {"command": " ".join(["python", "experiments/spec_decoding/run.py"] + [shlex.quote(a) for a in argv]),
            "date": datetime.datetime.now().isoformat(timespec="minutes"), "jax_version": jax.__version__,
            "backend": jax.default_backend(), "loadavg_start": load_start,
            "loadavg_end": " ".join(f"{x:.1f}" for x in os.getloadavg()), "smoke": cfg.smoke,
            "target": cfg.target, "draft": cfg.draft, "method": cfg.method, "prompt_len": cfg.prompt_len,
            "max_tokens": cfg.max_tokens,
            "repeats": cfg.repeats}
    tag = "" if cfg.method == "draft_model" else f"_{cfg.method}"
    stem = (f"smoke_results{tag}.json", f"SMOKE{tag}.md") if cfg.smoke else (f"results{tag}.json", f"RESULTS{tag}.md")
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, stem[0]), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(cfg.out_dir, stem[1]), "w") as f:
        f.write(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main(sys.argv[1:])
