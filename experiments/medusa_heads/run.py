"""Medusa-1 heads on a frozen target: train on the pycode corpus or a token stream (the target's own chat
answers: ``windows=``), report per-head accuracy, save the heads.

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
from experiments.medusa_heads.training import (evaluate, heads_step, make_optimizer, target_chunks, train_step,
                                               window_length)

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


def stream_windows(path: str, seq_len: int, length: int, eval_windows: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) windows i32[W, length] at stride seq_len of the token stream i32[N] in file ``path``."""
    full = os.path.join(ROOT, path)
    stream = np.load(full)
    if stream.ndim != 1 or not np.issubdtype(stream.dtype, np.integer):
        raise ValueError(f"windows={path!r}: expected a token stream i32[N], got {stream.dtype}{list(stream.shape)} "
                         "(pass onpolicy_chat.py's <out>.npy, not <out>_windows.npy)")
    if stream.size and (stream.min() < 0 or stream.max() >= vocab):
        raise ValueError(f"windows={path!r}: token ids outside the target's vocabulary [0, {vocab})")
    n = (len(stream) - length) // seq_len + 1 if len(stream) >= length else 0
    if n <= eval_windows:
        raise ValueError(f"windows={path!r}: {len(stream)} tokens make {n} windows of {length}; "
                         f"eval_windows={eval_windows} leaves none to train on")
    idx = np.arange(n)[:, None] * seq_len + np.arange(length)[None, :]
    w = stream[idx].astype(np.int32)
    return w[:n - eval_windows], w[n - eval_windows:]


def window_order(num_windows: int, needed: int, rng) -> np.ndarray:
    """Indices of the windows each step reads in turn: in order if there are enough, else epoch-wise permutations."""
    if num_windows >= needed:
        return np.arange(needed)
    return np.concatenate([rng.permutation(num_windows) for _ in range(-(-needed // num_windows))])[:needed]


def precomputed(tparams, tcfg, windows, cfg) -> dict:
    """The target's hidden states f32[W, T, E] and labels i32[W, T, K] of every window, as host arrays."""
    chunks = target_chunks(tparams, windows, target_config=tcfg, num_heads=cfg.num_heads, chunk=cfg.eval_chunk)
    hidden, target_y, corpus_y = (np.concatenate([np.asarray(c[i]) for c in chunks]) for i in range(3))
    return {"hidden": hidden, "labels": target_y if cfg.labels == "target" else corpus_y}


def check(cfg) -> None:
    if cfg.labels not in ("target", "corpus"):
        raise ValueError(f"labels must be 'target' or 'corpus', got {cfg.labels!r}")
    for name in ("num_heads", "seq_len", "batch_size", "steps", "eval_windows", "eval_chunk", "eval_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.windows is not None and not os.path.isfile(os.path.join(ROOT, cfg.windows)):
        raise ValueError(f"windows={cfg.windows!r}: no such file (write it with scripts/onpolicy_chat.py)")


def data(cfg, tok, vocab: int, length: int, rng) -> tuple[np.ndarray, np.ndarray, str]:
    """(train windows, evaluation windows, a sentence on where they come from)."""
    if cfg.windows is not None:
        train, val = stream_windows(cfg.windows, cfg.seq_len, length, cfg.eval_windows, vocab)
        return train, val, (f"windows of the token stream `{cfg.windows}` at stride {cfg.seq_len}; accuracy on "
                            f"its last {cfg.eval_windows} windows, held out")
    train = token_windows(tok, vocab, "train", length, cfg.steps * cfg.batch_size, rng)
    val = token_windows(tok, vocab, "val", length, cfg.eval_windows, rng)
    return train, val, ("random windows of the pycode train split; accuracy on val-split windows" if tok is not None
                        else "random token ids: smoke only; accuracy on other random windows")


def run(cfg, out):
    check(cfg)
    tcfg, tparams, tok = load_target(cfg.target, cfg.seed)
    hcfg = MedusaConfig(tcfg.hidden_size, tcfg.vocab_size, cfg.num_heads, cfg.num_layers)
    rng = np.random.default_rng(cfg.seed)
    length = window_length(cfg.seq_len, hcfg)
    train, val, source = data(cfg, tok, tcfg.vocab_size, length, rng)
    order = window_order(len(train), cfg.steps * cfg.batch_size, rng)
    start = time.perf_counter()
    val_out = target_chunks(tparams, val, target_config=tcfg, num_heads=cfg.num_heads, chunk=cfg.eval_chunk)
    used = np.unique(order)
    cache = precomputed(tparams, tcfg, train[used], cfg) if cfg.precompute else None
    slot = np.zeros(len(train), np.int64)
    slot[used] = np.arange(len(used))
    target_s = time.perf_counter() - start
    out.text(f"Labels: {cfg.labels}. Target {cfg.target} (frozen); {cfg.num_heads} heads of {cfg.num_layers} "
             f"residual block(s) + a linear map initialised from the LM head; {cfg.steps} steps of "
             f"{cfg.batch_size} windows x {cfg.seq_len} positions ({len(train)} windows, "
             f"{len(train) * cfg.seq_len} training positions, {len(order) / len(train):.2f} epochs; {source}).")
    heads = init_medusa_params(hcfg, tparams, tcfg)
    optimizer = make_optimizer(cfg.learning_rate, cfg.steps, cfg.warmup)
    opt_state = optimizer.init(heads)
    curve, evals, stopped, step_s = [], [], None, []

    def record(step):
        acc, agree = evaluate(heads, val_out, heads_config=hcfg)
        evals.append({"step": step, **{f"acc_head{k + 1}": float(a) for k, a in enumerate(acc)},
                      **{f"agree_head{k + 1}": float(a) for k, a in enumerate(agree)},
                      "minutes": (time.perf_counter() - start) / 60})

    record(0)
    for step in out.progress(range(cfg.steps), desc="medusa heads", total=cfg.steps):
        t0 = time.perf_counter()
        ids = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        if cache is None:
            heads, opt_state, loss, _ = train_step(heads, opt_state, tparams, train[ids], optimizer=optimizer,
                                                   decay=cfg.decay, labels=cfg.labels, target_config=tcfg,
                                                   heads_config=hcfg)
        else:
            heads, opt_state, loss, _ = heads_step(heads, opt_state, cache["hidden"][slot[ids]],
                                                   cache["labels"][slot[ids]], heads_config=hcfg,
                                                   optimizer=optimizer, decay=cfg.decay)
        curve.append(float(loss))
        step_s.append(time.perf_counter() - t0)
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
    n_target = len(val) + (len(used) if cache is not None else 0)
    out.json("timing", {"target_pass_s": target_s, "target_pass_windows": n_target,
                        "median_step_s": float(np.median(step_s[1:] or step_s))})
    out.text(f"Target passes before training (the evaluation windows"
             + (", and every training window once" if cache is not None else "") + f"): {target_s:.0f} s for "
             f"{n_target} windows ({target_s / n_target:.2f} s each, compilation included); median training step "
             f"{float(np.median(step_s[1:] or step_s)):.2f} s ("
             + ("heads only, on the precomputed hidden states" if cache is not None else "a target forward and the heads")
             + ").")
    out.text(f"Heads saved to `{os.path.relpath(heads_dir, ROOT)}`."
             + (f" Stopped at step {stopped} of {cfg.steps}: past max_minutes={cfg.max_minutes}." if stopped else ""))
