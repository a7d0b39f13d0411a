"""Trains an EAGLE draft for SmolLM2-135M-Instruct on its own answers (``jaxserve.train.eagle``).

    python scripts/onpolicy_chat.py out=runs/onpolicy/eagle_s2 mix=edits pack=true seq_len=512 \
        max_prompt_tokens=160 max_tokens=192 plain_fraction=0.1 sampled_fraction=0.25 budget_s=540 seed=2
    python scripts/train_eagle.py data=runs/onpolicy/eagle_s2 out=runs/eagle/smollm2

Each prompt + answer piece of the on-policy stream is one row (right-padded to ``seq_len``, positions from 0,
as serving gives them); the target's hidden states and greedy labels are computed once and cached beside the
data (``<data>_eagle_feats.npz``). The head keeps the ``head_tokens`` most frequent greedy labels. The last
``eval_rows`` rows are held out: ``acc1`` is the draft's first-token agreement with the target's greedy token
(teacher-forced, every position), ``acc2`` the same one step deep (reading its own previous feature), ``acc_deep``
``ttt_steps`` deep.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

from jaxserve.config import apply_overrides

EOS, NEWLINE = 2, 198  # SmolLM2's <|im_end|> and "\n": a piece ends at an EOS that no newline follows


@dataclasses.dataclass(frozen=True)
class EagleTrainConfig:
    target: str = "smollm2-135m-instruct"
    data: str = "runs/onpolicy/eagle_s2"  # onpolicy_chat.py's out (its <data>.npy stream); several: comma-separated
    out: str = "runs/eagle/smollm2"
    seq_len: int = 384
    head_tokens: int = 8192
    intermediate_size: int = 0  # 0: the target's
    batch_size: int = 8
    steps: int = 600
    lr: float = 1e-3
    warmup: int = 30
    noise: float = 0.05
    cls_weight: float = 0.1  # the cross-entropy's weight beside the feature regression's 1 (EAGLE-1: 0.1)
    ttt_steps: int = 1  # passes over the draft's own features (EAGLE-3's training-time test), each one step deeper
    init_from: str = ""  # a saved draft to continue from (its head tokens are kept)
    eval_rows: int = 32
    eval_every: int = 100
    seed: int = 0
    budget_s: float = 3600.0


def pieces(stream: np.ndarray, ends: np.ndarray | None) -> list[np.ndarray]:
    if ends is None:
        cut = np.nonzero((stream[:-1] == EOS) & (stream[1:] != NEWLINE))[0] + 1
        ends = np.append(cut, len(stream))
    return [stream[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]


def rows(parts: list[np.ndarray], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens i32[R, seq_len] (EOS-padded) and mask f32[R, seq_len] (1 on each piece's tokens)."""
    tokens = np.full((len(parts), seq_len), EOS, np.int32)
    mask = np.zeros((len(parts), seq_len), np.float32)
    for i, p in enumerate(parts):
        n = min(len(p), seq_len)
        tokens[i, :n], mask[i, :n] = p[:n], 1.0
    return tokens, mask


def main(argv: list[str]) -> None:
    import jax
    import jax.numpy as jnp

    from jaxserve.kernels.cpu import amx_usable
    from jaxserve.kernels.cpu.packed import pack_dense_kernels, pack_tied_head
    from jaxserve.models.loading import resolve_model
    from jaxserve.speculative.eagle import eagle_config, eagle_head, init_eagle_params, load_eagle, save_eagle
    from jaxserve.train.eagle import eval_metrics, make_optimizer, target_features, train_step, width

    cfg = apply_overrides(EagleTrainConfig(), argv)
    t0 = time.perf_counter()
    tconfig, tparams, _ = resolve_model(cfg.target, dtype="bfloat16")
    # the features through the serving engine's packed AMX GEMMs where it runs them: the hidden states the draft
    # reads when serving (faster than XLA's bf16 dot, too)
    fparams = pack_tied_head(pack_dense_kernels(tparams)) if amx_usable() else tparams

    def source(name: str):
        """One onpolicy_chat.py output: its pieces, their rows, and the target's features (cached beside it)."""
        data = pathlib.Path(name)
        ends_file = data.parent / f"{data.name}_ends.npy"
        parts = pieces(np.load(data.with_suffix(".npy")), np.load(ends_file) if ends_file.is_file() else None)
        tokens, mask = rows(parts, cfg.seq_len)
        cache = data.parent / f"{data.name}_eagle_feats_{cfg.seq_len}.npz"
        if cache.is_file():
            with np.load(cache) as f:
                return parts, tokens, mask, f["feats"].view(jnp.bfloat16), f["labels"]
        feats, labels = target_features(fparams, tconfig, tokens, mask.sum(1).astype(int), progress=lambda n: print(
            f"{name}: features {min(n, len(tokens))}/{len(tokens)} rows, {time.perf_counter() - t0:.0f} s",
            flush=True))
        np.savez(cache, feats=feats.view(np.uint16), labels=labels)
        return parts, tokens, mask, feats, labels

    sources = [source(name) for name in cfg.data.split(",")]  # the held-out rows: the last source's last
    parts = [p for s in sources for p in s[0]]
    tokens, mask, feats, labels = (np.concatenate([s[i] for s in sources]) for i in range(1, 5))
    print(f"{len(parts)} pieces, {int(mask.sum())} tokens, features ready at {time.perf_counter() - t0:.0f} s",
          flush=True)
    n_eval = cfg.eval_rows
    train_idx = np.arange(len(tokens) - n_eval)
    eval_idx = np.arange(len(tokens) - n_eval, len(tokens))
    counts = np.bincount(labels[train_idx][mask[train_idx] > 0], minlength=tconfig.vocab_size)
    head_ids = np.sort(np.argsort(-counts, kind="stable")[:cfg.head_tokens])
    if cfg.init_from:
        head_ids = load_eagle(cfg.init_from)[2]
    print(f"head: {cfg.head_tokens} tokens cover {counts[head_ids].sum() / counts.sum():.4f} of the labels", flush=True)
    head = eagle_head(tparams, tconfig, head_ids)
    label_index = np.full(tconfig.vocab_size, -1, np.int32)
    label_index[head_ids] = np.arange(len(head_ids))
    dconfig = eagle_config(tconfig, cfg.intermediate_size or None).replace(dtype="float32")
    if cfg.init_from:  # continue a saved draft (float32 from its bf16 weights)
        _, params, _ = load_eagle(cfg.init_from, "float32")
    else:
        params = init_eagle_params(dconfig, jax.tree.map(lambda a: a.astype(jnp.float32), tparams),
                                   jax.random.key(cfg.seed))
    optimizer = make_optimizer(cfg.lr, cfg.steps, cfg.warmup)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(cfg.seed)
    epochs = cfg.steps * cfg.batch_size // len(train_idx) + 1
    order = np.concatenate([rng.permutation(train_idx) for _ in range(epochs)])
    common = (head.kernel, jnp.asarray(label_index))
    log, key = [], jax.random.key(cfg.seed + 1)

    def evaluate():
        ms = [eval_metrics(params, tparams, tokens[eval_idx[i:i + 8]], feats[eval_idx[i:i + 8]],
                           labels[eval_idx[i:i + 8]], *common, mask[eval_idx[i:i + 8]], draft_config=dconfig,
                           ttt_steps=cfg.ttt_steps)
              for i in range(0, n_eval, 8)]
        return {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}

    lengths = mask.sum(1).astype(int)
    log.append({"step": 0, "elapsed_s": round(time.perf_counter() - t0, 1), **evaluate()})  # (a draft continued: its
    print("eval", log[-1], flush=True)                                                    # start on these rows)
    for step in range(cfg.steps):
        b = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        n = min(width(int(lengths[b].max())), cfg.seq_len)  # the batch cut to its longest row
        key, sub = jax.random.split(key)
        params, opt_state, m = train_step(params, opt_state, tparams, tokens[b, :n], feats[b, :n], labels[b, :n],
                                          *common, mask[b, :n], sub, draft_config=dconfig, optimizer=optimizer,
                                          noise=cfg.noise, cls_weight=cfg.cls_weight,
                                          ttt_steps=cfg.ttt_steps)
        if step % 20 == 0:
            print(step, {k: round(float(v), 4) for k, v in m.items()}, f"{time.perf_counter() - t0:.0f} s", flush=True)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps or time.perf_counter() - t0 > cfg.budget_s:
            ev = evaluate()
            log.append({"step": step + 1, "elapsed_s": round(time.perf_counter() - t0, 1), **ev})
            print("eval", log[-1], flush=True)
            if time.perf_counter() - t0 > cfg.budget_s:
                break
    info = {"config": dataclasses.asdict(cfg), "pieces": len(parts), "tokens": int(mask.sum()), "eval": log,
            "head_coverage": float(counts[head_ids].sum() / counts.sum())}
    save_eagle(cfg.out, dconfig.replace(dtype="bfloat16"), params, head_ids, info)
    print(json.dumps(info["eval"][-1]))


if __name__ == "__main__":
    main(sys.argv[1:])
