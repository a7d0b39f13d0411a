"""Medusa-1 heads on the frozen zoo target: train on the pycode corpus, report per-head accuracy, save the heads.

    python -m experiments.medusa_heads [preset=smoke] [key=value ...]

The heads land in ``heads_dir`` (default ``runs/medusa_heads/tiny-code``), where
``SpeculativeConfig(method="medusa", medusa_heads=...)`` and ``experiments/spec_decoding`` read them.
"""
import os
import time

import jax
import numpy as np

from experiments.harness import ROOT
from jaxserve.models import get_preset, init_params
from jaxserve.models.loading import resolve_model
from jaxserve.speculative.medusa import MedusaConfig, init_medusa_params, save_heads
from experiments.medusa_heads.training import evaluate, make_optimizer, train_step, window_length

PRESET = "preset:"


def load_target(name: str, seed: int):
    if name.startswith(PRESET):
        config = get_preset(name[len(PRESET):])
        return config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(seed)), None
    return resolve_model(name)


def token_windows(tokenizer, vocab: int, split: str, length: int, count: int, rng) -> np.ndarray:
    """count windows i32[count, length] of the split (random tokens when there is no tokenizer)."""
    if tokenizer is None:
        return rng.integers(0, vocab, (count, length)).astype(np.int32)
    from jaxserve.train.data import encode_split
    stream = encode_split(tokenizer, None, split)
    starts = rng.integers(0, len(stream) - length, count)
    return np.stack([stream[s:s + length] for s in starts]).astype(np.int32)


def run(cfg, out):
    tcfg, tparams, tok = load_target(cfg.target, cfg.seed)
    if cfg.labels not in ("target", "corpus"):
        raise ValueError(f"labels must be 'target' or 'corpus', got {cfg.labels!r}")
    hcfg = MedusaConfig(tcfg.hidden_size, tcfg.vocab_size, cfg.num_heads, cfg.num_layers)
    rng = np.random.default_rng(cfg.seed)
    length = window_length(cfg.seq_len, hcfg)
    train = token_windows(tok, tcfg.vocab_size, "train", length, cfg.steps * cfg.batch_size, rng)
    val = token_windows(tok, tcfg.vocab_size, "val", length, cfg.eval_windows, rng)
    out.text(f"Labels: {cfg.labels}. Target {cfg.target} (frozen); {cfg.num_heads} heads of {cfg.num_layers} "
             f"residual block(s) + a linear map initialised from the LM head; {cfg.steps} steps of "
             f"{cfg.batch_size} windows x "
             f"{cfg.seq_len} positions ({len(train) * cfg.seq_len} training positions, "
             + ("random windows of the pycode train split); accuracy on val-split windows." if tok is not None else
                "random token ids: smoke only); accuracy on other random windows."))
    heads = init_medusa_params(hcfg, tparams, tcfg)
    optimizer = make_optimizer(cfg.learning_rate, cfg.steps, cfg.warmup)
    opt_state = optimizer.init(heads)
    static = dict(target_config=tcfg, heads_config=hcfg)
    curve, evals, start, stopped = [], [], time.perf_counter(), None

    def record(step):
        acc, agree = jax.device_get(evaluate(heads, tparams, val, **static))
        evals.append({"step": step, **{f"acc_head{k + 1}": float(a) for k, a in enumerate(acc)},
                      **{f"agree_head{k + 1}": float(a) for k, a in enumerate(agree)},
                      "minutes": (time.perf_counter() - start) / 60})

    record(0)
    for step in out.progress(range(cfg.steps), desc="medusa heads", total=cfg.steps):
        batch = train[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        heads, opt_state, loss, _ = train_step(heads, opt_state, tparams, batch, optimizer=optimizer,
                                               decay=cfg.decay, labels=cfg.labels, **static)
        curve.append(float(loss))
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            record(step + 1)
        if time.perf_counter() - start > 60 * cfg.max_minutes:
            stopped = step + 1
            record(step + 1)
            break
    heads_dir = os.path.join(ROOT, cfg.heads_dir) if cfg.heads_dir else os.path.join(out.out_dir, "heads")
    save_heads(heads_dir, hcfg, heads, info={"target": cfg.target, "steps": stopped or cfg.steps,
                                              "final_eval": evals[-1]})
    cols = {"step": "step", "minutes": "min", **{f"acc_head{k}": f"head {k} acc" for k in range(1, cfg.num_heads + 1)},
            **{f"agree_head{k}": f"head {k} = target" for k in range(1, cfg.num_heads + 1)}}
    out.table("eval", evals, columns=cols, fmt={c: ".3f" for c in cols if c != "step"},
              title="Top-1 accuracy per head on val windows: against the corpus token t+1+k, and agreement with "
                    "the target's own argmax for that token given the true prefix (what greedy verification checks)")
    with out.figure("loss", "training loss (weighted sum over heads)") as ax:
        ax.plot(np.arange(1, len(curve) + 1), curve)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
    out.json("loss_curve", curve)
    out.json("heads_dir", os.path.relpath(heads_dir, ROOT))
    out.text(f"Heads saved to `{os.path.relpath(heads_dir, ROOT)}`."
             + (f" Stopped at step {stopped} of {cfg.steps}: past max_minutes={cfg.max_minutes}." if stopped else ""))
