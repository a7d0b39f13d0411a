"""Training an EAGLE draft (``jaxserve.speculative.eagle``) on a frozen target's hidden states.

Axis names: W windows, B batch, S window length, E hidden size, N the draft head's tokens.

The target runs once over every window (``target_features``): its final-normed hidden states f[W, S, E] and
its greedy labels y[W, S] (y_p = argmax of the head on f_p: the token the target would put at p+1). A draft
step at p reads (x_p, f_{p-1}) and is trained as in EAGLE-1: a smooth-L1 regression of f̂_p on f_p plus 0.1 x
the cross-entropy of the head cut to N tokens against y_p (``cls_weight``; positions whose y lies outside the N
tokens only regress). Drafting feeds f̂ back, which the teacher-forced pass never sees; a second pass over the window
with f̂ in place of f (EAGLE-3's "training-time test") adds its cross-entropy, and ``ttt_steps`` such passes
each read the one before's features: a round of γ draft steps reads its own features up to γ - 1 deep.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import forward_hidden
from jaxserve.speculative.eagle import draft_hidden, target_embed, target_head

CLS_WEIGHT = 0.1  # EAGLE-1's: the cross-entropy's weight beside the regression's 1


@partial(jax.jit, static_argnames="target_config")
def _target_chunk(target_params, tokens, *, target_config: ModelConfig):
    f = forward_hidden(target_params, target_config, tokens)
    b, s, e = f.shape
    logits = target_head(target_params, target_config, f.astype(target_config.dtype).reshape(b * s, e))
    return f.astype(jnp.bfloat16), jnp.argmax(logits, axis=-1).astype(jnp.int32).reshape(b, s)


def width(n: int, multiple: int = 64) -> int:
    """A batch's length rounded up to ``multiple`` (few distinct shapes to compile)."""
    return -(-max(n, 1) // multiple) * multiple


def target_features(target_params, target_config: ModelConfig, windows: np.ndarray, lengths: np.ndarray | None = None,
                    chunk: int = 8, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """The target's hidden states bf16[W, S, E] and greedy labels i32[W, S] over windows i32[W, S] whose first
    ``lengths[w]`` tokens count (the rest is padding, left zero): rows of similar length run together, each
    chunk cut to its longest row."""
    w, s = windows.shape
    lengths = np.full(w, s) if lengths is None else np.asarray(lengths)
    feats = np.zeros((w, s, target_config.hidden_size), jnp.bfloat16)
    labels = np.zeros((w, s), np.int32)
    order = np.argsort(lengths, kind="stable")
    for i in range(0, w, chunk):
        idx = order[i:i + chunk]
        n = min(width(int(lengths[idx].max())), s)
        f, y = _target_chunk(target_params, jnp.asarray(windows[idx, :n]), target_config=target_config)
        feats[idx, :n], labels[idx, :n] = np.asarray(f), np.asarray(y)
        if progress:
            progress(i + len(idx))
    return feats, labels


def shifted(f: jax.Array) -> jax.Array:
    """f[B, S, E] -> the features each position reads: f_{p-1}, zeros at p = 0."""
    return jnp.concatenate([jnp.zeros_like(f[:, :1]), f[:, :-1]], axis=1)


def eagle_loss(params, draft_config: ModelConfig, embeds, feats, labels, head_kernel, label_index, mask,
               noise_key=None, noise: float = 0.0, cls_weight: float = CLS_WEIGHT, ttt_steps: int = 1):
    """embeds/feats f32[B, S, E], labels i32[B, S] (the target's greedy y_p), head_kernel [E, N], label_index
    i32[V] (a token's column in the head, -1 outside it), mask f32[B, S] (positions that count). ``ttt_steps``:
    passes over the draft's own features (pass d reads pass d-1's, the teacher-forced pass's at d = 1).
    Returns (loss, metrics): ``acc1`` teacher-forced, ``acc2`` one step deep, ``acc_deep`` ``ttt_steps`` deep."""
    b, s, _ = feats.shape
    pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    inp = shifted(feats)
    if noise_key is not None and noise > 0:  # EAGLE-1: uniform noise on the features the draft reads
        inp = inp + jax.random.uniform(noise_key, inp.shape, minval=-noise, maxval=noise)
    col = label_index[labels]
    in_head = (col >= 0).astype(jnp.float32) * mask

    def step(features):
        fh, _ = draft_hidden(params, draft_config, embeds, features, pos)
        logits = jnp.einsum("bse,en->bsn", fh, head_kernel.astype(jnp.float32))
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(col, 0))
        hit = (jnp.argmax(logits, -1) == col).astype(jnp.float32)
        return fh, ce, hit

    fh, ce1, hit1 = step(inp)
    reg = optax.huber_loss(fh, feats, delta=1.0).mean(-1)  # smooth L1
    ce, hits, f_own = ce1, [hit1], fh
    for _ in range(ttt_steps):  # drafting from its own features, one step deeper each pass
        f_own, ce_d, hit_d = step(shifted(f_own))
        ce, hits = ce + ce_d, hits + [hit_d]
    denom = jnp.maximum(mask.sum(), 1.0)
    denom_h = jnp.maximum(in_head.sum(), 1.0)
    loss = (reg * mask).sum() / denom + cls_weight * (ce * in_head).sum() / denom_h
    metrics = {"reg": (reg * mask).sum() / denom, "ce": (ce1 * in_head).sum() / denom_h,
               "acc1": (hits[0] * mask).sum() / denom, "acc2": (hits[min(1, ttt_steps)] * mask).sum() / denom,
               "acc_deep": (hits[-1] * mask).sum() / denom}
    return loss, metrics


def make_optimizer(lr: float, steps: int, warmup: int):
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.05)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.0))


@partial(jax.jit, static_argnames=("draft_config", "optimizer", "noise", "cls_weight", "ttt_steps"),
         donate_argnames=("params", "opt_state"))
def train_step(params, opt_state, target_params, tokens, feats, labels, head_kernel, label_index, mask, key, *,
               draft_config: ModelConfig, optimizer, noise: float, cls_weight: float = CLS_WEIGHT, ttt_steps: int = 1):
    embeds = target_embed(target_params, draft_config, tokens).astype(jnp.float32)
    feats = feats.astype(jnp.float32)
    (loss, metrics), grads = jax.value_and_grad(eagle_loss, has_aux=True)(
        params, draft_config, embeds, feats, labels, head_kernel, label_index, mask, key, noise, cls_weight, ttt_steps)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss, **metrics}


@partial(jax.jit, static_argnames=("draft_config", "ttt_steps"))
def eval_metrics(params, target_params, tokens, feats, labels, head_kernel, label_index, mask, *,
                 draft_config: ModelConfig, ttt_steps: int = 1):
    embeds = target_embed(target_params, draft_config, tokens).astype(jnp.float32)
    _, metrics = eagle_loss(params, draft_config, embeds, feats.astype(jnp.float32), labels, head_kernel,
                            label_index, mask, ttt_steps=ttt_steps)
    return metrics
