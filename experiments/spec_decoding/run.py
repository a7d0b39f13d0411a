"""Speculative decoding vs target-only decoding: α, acceptance length vs theory, target calls, speedup.

    python -m experiments.spec_decoding [preset=smoke] [key=value ...]

Four proposers (a draft model, n-gram prompt lookup, Medusa heads, suffix decoding) on two paths: the jitted
while-loop generators (``jaxserve.speculative.generate``: the whole batch in one program) and the engine
(``LLM.generate`` with ``SpeculativeConfig``: one round per continuous-batching step). Each point
is timed against target-only decoding of the same prompts, alternating with it call by call.

Full run (the Medusa heads belong to one target: retrain them whenever the zoo target changes)::

    python -m experiments.medusa_heads      # <= 10 min (wall-clock guard); writes runs/medusa_heads/tiny-code
    python -m experiments.spec_decoding     # the whole grid into results/spec_decoding/

Budget: ~90 programs to compile (each (method, γ, batch) once; temperature is an array) at ~9 CPU-s
each, plus decoding: the full grid took 2255 s (38 min) on the idle 2-core machine (2026-11-30, 7de7442).
"""
import os

import jax
import numpy as np

from experiments.harness import ROOT
from jaxserve.models import get_preset, init_params
from jaxserve.models.loading import model_path, resolve_model, widen_mlp, with_matmul_dtype
from experiments.spec_decoding.measure import measure_engine_point, measure_point
from jaxserve.speculative.draft_vocab import restrict_head
from jaxserve.speculative.token_counts import load_counts, most_frequent
from jaxserve.speculative.medusa import MedusaConfig, init_medusa_params, load_heads
from jaxserve.train.data import prompt_windows

PRESET = "preset:"
COLUMNS = {"method": "method", "temperature": "T", "batch": "batch", "prompts": "prompts", "gamma": "γ",
           "token_acceptance_prob": "α",
           "acceptance_rate": "vLLM rate", "mean_acceptance_length": "length", "theory_acceptance_length": "theory",
           "acceptance_length_vs_theory": "Δ", "target_calls_per_token": "calls/tok",
           "spec_tokens_per_s": "spec tok/s", "baseline_tokens_per_s": "base tok/s", "speedup": "speedup",
           "decode_speedup": "decode speedup"}
FMT = {"temperature": "g", "token_acceptance_prob": ".3f", "acceptance_rate": ".3f",
       "mean_acceptance_length": ".2f", "theory_acceptance_length": ".2f", "acceptance_length_vs_theory": "+.1%",
       "target_calls_per_token": ".3f", "spec_tokens_per_s": ".0f", "baseline_tokens_per_s": ".0f",
       "speedup": lambda r: f"{r['speedup']:.2f}x", "decode_speedup": lambda r: f"{r['decode_speedup']:.2f}x"}


def load(name: str, seed: int, matmul_dtype: str | None = None):
    """(config, params, tokenizer or None); presets get random weights."""
    if name.startswith(PRESET):
        config = get_preset(name[len(PRESET):])
        return (*with_matmul_dtype(config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(seed)),
                                   matmul_dtype), None)
    return resolve_model(name, matmul_dtype=matmul_dtype)


def make_prompts(cfg, tokenizer, vocab: int, batch: int) -> np.ndarray:
    """i32[S, batch, prompt_len]: S = ceil(min_prompts / batch) prompt sets (each timed on its own)."""
    sets = -(-cfg.min_prompts // batch)
    if cfg.repetitive_prompts:
        half = prompt_windows(tokenizer, vocab, sets * batch, cfg.prompt_len - cfg.prompt_len // 2, cfg.seed + batch)
        prompts = np.concatenate([half, half[:, :cfg.prompt_len // 2]], axis=1)
    else:
        prompts = prompt_windows(tokenizer, vocab, sets * batch, cfg.prompt_len, cfg.seed + batch)
    return prompts.reshape(sets, batch, cfg.prompt_len)


def proposers(cfg, tcfg, tparams):
    """method -> proposer weights: (config, params) of the draft (with ``draft_vocab_size``: and no tokenizer
    and its token counts, as ``LLM.from_params(draft=...)`` takes them) or the Medusa heads; None for ngram."""
    out = {}
    if "draft_model" in cfg.methods + cfg.engine_methods:
        dcfg, dparams, _ = load(cfg.draft, cfg.seed + 1, cfg.draft_matmul_dtype or cfg.matmul_dtype)
        out["draft_model"] = (dcfg, dparams)
        if cfg.draft_vocab_size:  # no tokenizer: the engine points build the target from params without its own
            out["draft_model"] += (None, load_counts(model_path(cfg.draft), dcfg.vocab_size))
    for method in ("ngram", "suffix"):
        if method in cfg.methods + cfg.engine_methods:
            out[method] = None
    if "medusa" in cfg.methods + cfg.engine_methods:
        if cfg.medusa_heads is None:
            hcfg = MedusaConfig(tcfg.hidden_size, tcfg.vocab_size, max(cfg.gammas + cfg.engine_gammas))
            out["medusa"] = (hcfg, init_medusa_params(hcfg, tparams, tcfg))
        else:
            out["medusa"] = load_heads(os.path.join(ROOT, cfg.medusa_heads))
    return out


def run(cfg, out):
    tcfg, tparams, tok = load(cfg.target, cfg.seed, cfg.matmul_dtype)
    widened = ""
    if cfg.target_widen_mlp:
        tcfg, tparams = widen_mlp(tcfg, tparams, cfg.target_widen_mlp)
        widened = (f" with its MLPs widened to {cfg.target_widen_mlp} by zero weights (the same tokens, more bytes "
                   "a step)")
    props = proposers(cfg, tcfg, tparams)
    draft_head, restricted = None, ""
    if cfg.draft_vocab_size and "draft_model" in props:
        dcfg, dparams, _, counts = props["draft_model"]
        draft_head = restrict_head(dcfg, dparams, most_frequent(counts, cfg.draft_vocab_size))
        restricted = f" proposing only its {cfg.draft_vocab_size} most frequent tokens (its LM head cut to them)"
    eos = None if cfg.ignore_eos else tcfg.eos_token_id
    heads = props["medusa"][0].num_heads if "medusa" in props else 0
    prompt_set = " (repetitive: each a half-length window written twice)" if cfg.repetitive_prompts else ""
    out.text(f"Target {cfg.target}{widened}; draft {cfg.draft}{restricted}; Medusa heads "
             f"{cfg.medusa_heads or 'untrained (initialised from the LM head)'} ({heads} heads: γ <= {heads}). "
             f"Prompts of {cfg.prompt_len} tokens{prompt_set}, {cfg.max_tokens} generated per row (engine: "
             f"{cfg.engine_max_tokens}), fastest of {cfg.repeats} timed calls, each point's calls alternating "
             "with as many of its own baseline (so drift in the machine's speed hits both alike). A point covers "
             f"at least {cfg.min_prompts} prompts: batches smaller than that run ceil({cfg.min_prompts} / batch) "
             "prompt sets, each timed on its own, and a side's time is the sum of each set's fastest call.\n\n"
             "α = accepted / reached (Leviathan's per-token α); vLLM rate = accepted / drafted; length = 1 + "
             "accepted / rounds; theory = (1 - α^(γ+1)) / (1 - α); calls/tok = target forward passes (prefill "
             "included) per generated token; speedup = tokens/s over target-only decoding of the same prompts "
             "timed alongside (the engine path: over a plain engine); base tok/s is that point's baseline; "
             "decode speedup = the same for the tokens after each row's first, over the time after the prefill "
             "(a call's minus a prefill-only call's, max_tokens 1, timed alongside): the decode phase alone, "
             "as TPOT compares it. The best-γ table picks by end-to-end speedup.")
    points = [(m, b, t) for m in cfg.methods for b in cfg.batches for t in cfg.temperatures]
    rows = {m: [] for m in cfg.methods}
    for method, batch, temperature in out.progress(points, desc="generate points"):
        prompts = make_prompts(cfg, tok, tcfg.vocab_size, batch)
        gammas = [g for g in cfg.gammas if method != "medusa" or g <= heads]
        rows[method] += measure_point((tcfg, tparams), props.get(method) or (None, None), prompts,
                                      np.full(prompts.shape[:2], cfg.prompt_len), gammas=gammas,
                                      temperature=temperature,
                                      max_tokens=cfg.max_tokens, eos_token_id=eos, repeats=cfg.repeats,
                                      block_size=cfg.block_size, seed=cfg.seed, method=method,
                                      draft_head=draft_head if method == "draft_model" else None)
        # ~90 programs in one process exhausted the kernel's memory-map limit (vm.max_map_count 65530:
        # each XLA:CPU kernel is JIT-mapped): a finished point's programs are never used again
        jax.clear_caches()
    for method in cfg.methods:
        out.table(method, rows[method], columns=COLUMNS, fmt=FMT, title=f"While-loop path: {method}")
    engine = []
    engine_props = {m: props[m] for m in cfg.engine_methods}
    for batch, temperature in out.progress([(b, t) for b in cfg.batches for t in cfg.temperatures],
                                           desc="engine points"):
        gammas = [g for g in cfg.engine_gammas if "medusa" not in engine_props or g <= heads]
        engine += measure_engine_point((tcfg, tparams), engine_props, make_prompts(cfg, tok, tcfg.vocab_size, batch),
                                       gammas=gammas, temperature=temperature, max_tokens=cfg.engine_max_tokens,
                                       repeats=cfg.repeats,
                                       # no prefix caching: every timed call does the same prefill as the first
                                       engine_kwargs={"block_size": cfg.block_size, "enable_prefix_caching": False},
                                       seed=cfg.seed, draft_vocab_size=cfg.draft_vocab_size)
        jax.clear_caches()
    if engine:
        out.table("engine", engine, columns=COLUMNS, fmt=FMT,
                  title="Engine path: LLM.generate, one speculative round per step, vs a plain engine")
    everything = [r for m in cfg.methods for r in rows[m]] + engine
    out.table("best", best_rows(everything), columns={"path": "path", **COLUMNS}, fmt=FMT,
              title="Best γ per (path, method, temperature, batch)")
    plot(out, everything, cfg)


def best_rows(rows):
    best = {}
    for r in rows:
        key = (r["path"], r["method"], r["temperature"], r["batch"])
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return list(best.values())


def plot(out, rows, cfg):
    with out.figure("speedup_vs_batch", "best-γ speedup over target-only decoding vs batch size "
                                        "(1 = break-even)") as ax:
        for r0 in {(r["path"], r["method"], r["temperature"]): r for r in rows}.values():
            pts = sorted((r["batch"], r["speedup"]) for r in best_rows(rows)
                         if (r["path"], r["method"], r["temperature"]) == (r0["path"], r0["method"], r0["temperature"]))
            ax.plot(*zip(*pts), marker="o", label=f"{r0['path']} {r0['method']} T={r0['temperature']:g}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("speedup")
        ax.legend(fontsize=6)
    with out.figure("acceptance_length", "measured mean acceptance length vs theory (1 - α^(γ+1)) / (1 - α), "
                                         "while-loop path") as ax:
        gen = [r for r in rows if r["path"] == "generate"]
        ax.scatter([r["theory_acceptance_length"] for r in gen], [r["mean_acceptance_length"] for r in gen], s=10)
        top = max([r["gamma"] for r in gen] + [1]) + 1
        ax.plot([1, top], [1, top], color="gray", lw=0.8)
        ax.set_xlabel("theory")
        ax.set_ylabel("measured")
