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
from jaxserve.memory_maps import release_programs
from jaxserve.models import get_preset, init_params
from jaxserve.models.loading import model_path, resolve_model, widen_mlp, with_matmul_dtype
from experiments.spec_decoding.measure import engine_policy, measure_engine_point, measure_point
from experiments.spec_decoding.prompt_sets import CHAT_SETS, chat_prompts
from jaxserve.speculative.draft_vocab import restrict_head
from jaxserve.speculative.token_counts import load_counts, most_frequent
from jaxserve.speculative.eagle import load_eagle
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
# engine rows: the speculation policy, and the decode steps it ran plain out of all
ENGINE_COLUMNS = {"method": "method", "policy": "policy", "plain_steps": "plain steps",
                  **{k: v for k, v in COLUMNS.items() if k != "method"}, "greedy_identical": "= plain"}
ENGINE_FMT = {**FMT, "plain_steps": lambda r: _steps(r),
              "greedy_identical": lambda r: {True: "yes", False: "**no**"}.get(r.get("greedy_identical"), "")}


def load(name: str, seed: int, matmul_dtype: str | None = None, dtype: str | None = None):
    """(config, params, tokenizer or None); presets get random weights."""
    if name.startswith(PRESET):
        config = get_preset(name[len(PRESET):])
        config = config if dtype is None else config.replace(dtype=dtype)
        return (*with_matmul_dtype(config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(seed)),
                                   matmul_dtype), None)
    return resolve_model(name, dtype, matmul_dtype)


def _steps(r) -> str:
    """A policy row's decode steps run plain / all its decode steps ("" for rows without a policy)."""
    if r.get("plain_steps") is None:
        return ""
    return f"{r['plain_steps']}/{r['plain_steps'] + r['speculative_steps']}"


def make_prompts(cfg, tokenizer, vocab: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(i32[S, batch, prompt_len], their lengths i32[S, batch]): S = ceil(min_prompts / batch) prompt sets (each
    timed on its own); chat prompts are right-padded with 0."""
    sets = -(-cfg.min_prompts // batch)
    if cfg.prompt_set in CHAT_SETS:
        ids = chat_prompts(tokenizer, cfg.prompt_set, sets * batch, cfg.prompt_len, cfg.seed)
        prompts = np.zeros((sets * batch, cfg.prompt_len), np.int32)
        for i, p in enumerate(ids):
            prompts[i, :len(p)] = p
        lens = np.array([len(p) for p in ids], np.int32)
    elif cfg.repetitive_prompts:
        half = prompt_windows(tokenizer, vocab, sets * batch, cfg.prompt_len - cfg.prompt_len // 2, cfg.seed + batch)
        prompts = np.concatenate([half, half[:, :cfg.prompt_len // 2]], axis=1)
        lens = np.full(sets * batch, cfg.prompt_len, np.int32)
    else:
        prompts = prompt_windows(tokenizer, vocab, sets * batch, cfg.prompt_len, cfg.seed + batch)
        lens = np.full(sets * batch, cfg.prompt_len, np.int32)
    return prompts.reshape(sets, batch, cfg.prompt_len), lens.reshape(sets, batch)


def check(cfg) -> None:
    """Settings that would fail only after the model is loaded: a ValueError naming them, before anything runs."""
    if cfg.prompt_set not in ("code",) + CHAT_SETS:
        raise ValueError(f"prompt_set must be 'code' or one of {CHAT_SETS}, got {cfg.prompt_set!r}")
    if cfg.prompt_set in CHAT_SETS and (cfg.target.startswith(PRESET) or cfg.repetitive_prompts):
        raise ValueError(f"prompt_set={cfg.prompt_set!r} needs a target with a chat template (not a preset) and "
                         "repetitive_prompts=false")
    for policy in cfg.engine_policies:
        engine_policy(policy)
    if "eagle" in cfg.methods:
        raise ValueError("methods: 'eagle' runs on the engine path only (engine_methods=[eagle])")
    if "eagle" in cfg.engine_methods and cfg.eagle is None:
        raise ValueError("engine_methods has 'eagle' but eagle=null: give an EAGLE draft's directory")


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
    if "eagle" in cfg.engine_methods:
        out["eagle"] = load_eagle(model_path(cfg.eagle if cfg.eagle.startswith("jaxserve/")
                                             else os.path.join(ROOT, cfg.eagle)), tcfg.dtype)
    return out


def run(cfg, out):
    check(cfg)
    tcfg, tparams, tok = load(cfg.target, cfg.seed, cfg.matmul_dtype, cfg.dtype)
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
    prompt_set = {"chat_repetitive": " at most (chat template over code and text edits whose answers quote the input: "
                                     "experiments/spec_decoding/prompt_sets.py)",
                  "chat_free": " at most (chat template over open questions: experiments/spec_decoding/prompt_sets.py)"
                  }.get(cfg.prompt_set, " (repetitive: each a half-length window written twice)"
                        if cfg.repetitive_prompts else "")
    ending = " (EOS ignored)" if cfg.ignore_eos else ", fewer where a row ends at EOS"
    factor = "" if cfg.suffix_spec_factor == 1 else \
        f"; suffix drafts reach at most {cfg.suffix_spec_factor:g}x the matched context's length"
    eagle = f"; EAGLE draft {cfg.eagle} (its head cut to {len(props['eagle'][2])} tokens)" if "eagle" in props else ""
    out.text(f"Target {cfg.target} ({tcfg.dtype}){widened}; draft {cfg.draft}{restricted}; Medusa heads "
             f"{cfg.medusa_heads or 'untrained (initialised from the LM head)'} ({heads} heads: γ <= {heads}){eagle}. "
             f"Prompts of {cfg.prompt_len} tokens{prompt_set}, {cfg.max_tokens} generated per row (engine: "
             f"{cfg.engine_max_tokens}){ending}{factor}, fastest of {cfg.repeats} timed calls, each point's calls "
             "alternating with as many of its own baseline (so drift in the machine's speed hits both alike). A point covers "
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
        prompts, lens = make_prompts(cfg, tok, tcfg.vocab_size, batch)
        gammas = [g for g in cfg.gammas if method != "medusa" or g <= heads]
        rows[method] += measure_point((tcfg, tparams), props.get(method) or (None, None), prompts, lens,
                                      gammas=gammas,
                                      temperature=temperature,
                                      max_tokens=cfg.max_tokens, eos_token_id=eos, repeats=cfg.repeats,
                                      block_size=cfg.block_size, seed=cfg.seed, method=method,
                                      draft_head=draft_head if method == "draft_model" else None)
        release_programs()  # ~90 programs in one process reached vm.max_map_count; below the bound they stay
    for method in cfg.methods:
        out.table(method, rows[method], columns=COLUMNS, fmt=FMT, title=f"While-loop path: {method}")
    engine = []  # saved after each point (engine_progress): a run cut short keeps the rows it measured
    engine_props = {m: props[m] for m in cfg.engine_methods}
    engine_points = [(b, t) for b in cfg.batches for t in cfg.temperatures]
    for done, (batch, temperature) in enumerate(out.progress(engine_points, desc="engine points"), 1):
        gammas = [g for g in cfg.engine_gammas if "medusa" not in engine_props or g <= heads]
        prompts, lens = make_prompts(cfg, tok, tcfg.vocab_size, batch)
        engine += measure_engine_point((tcfg, tparams), engine_props, prompts, lens=lens,
                                       policies=cfg.engine_policies, gammas=gammas, temperature=temperature,
                                       max_tokens=cfg.engine_max_tokens, repeats=cfg.repeats,
                                       # no prefix caching: every timed call does the same prefill as the first
                                       engine_kwargs={"block_size": cfg.block_size, "enable_prefix_caching": False},
                                       seed=cfg.seed, draft_vocab_size=cfg.draft_vocab_size,
                                       suffix_spec_factor=cfg.suffix_spec_factor, ignore_eos=cfg.ignore_eos)
        out.json("engine_progress", {"points_done": done, "rows": engine})
        release_programs()  # ~90 programs in one process reached vm.max_map_count; below the bound they stay
    if engine_points:
        out.json("engine_progress", {"points_done": len(engine_points)})  # complete: the rows are in the table
    if engine:
        out.table("engine", engine, columns=ENGINE_COLUMNS, fmt=ENGINE_FMT,
                  title="Engine path: LLM.generate, one speculative round per step, vs a plain engine")
    everything = [r for m in cfg.methods for r in rows[m]] + engine
    out.table("best", best_rows(everything), columns={"path": "path", **ENGINE_COLUMNS}, fmt=ENGINE_FMT,
              title="Best γ per (path, method, temperature, batch)")
    plot(out, everything, cfg)


def best_rows(rows):
    best = {}
    for r in rows:
        key = (r["path"], r["method"], r.get("policy"), r["temperature"], r["batch"])
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return list(best.values())


def plot(out, rows, cfg):
    with out.figure("speedup_vs_batch", "best-γ speedup over target-only decoding vs batch size "
                                        "(1 = break-even)") as ax:
        line = lambda r: (r["path"], r["method"], r.get("policy"), r["temperature"])  # noqa: E731
        for r0 in {line(r): r for r in rows}.values():
            pts = sorted((r["batch"], r["speedup"]) for r in best_rows(rows) if line(r) == line(r0))
            policy = f" {r0['policy']}" if r0.get("policy", "none") != "none" else ""
            ax.plot(*zip(*pts), marker="o", label=f"{r0['path']} {r0['method']}{policy} T={r0['temperature']:g}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("speedup")
        ax.legend(fontsize=6)
    with out.figure("acceptance_length", "measured mean acceptance length vs theory (1 - α^(γ+1)) / (1 - α)") as ax:
        for path, marker in (("generate", "o"), ("engine", "x")):
            pts = [r for r in rows if r["path"] == path]
            if pts:
                ax.scatter([r["theory_acceptance_length"] for r in pts], [r["mean_acceptance_length"] for r in pts],
                           s=12, marker=marker, label=path)
        top = max([r["gamma"] for r in rows] + [1]) + 1
        ax.plot([1, top], [1, top], color="gray", lw=0.8)
        ax.set_xlabel("theory")
        ax.set_ylabel("measured")
        ax.legend(fontsize=6)
