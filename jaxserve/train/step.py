"""The jitted training step and evaluation, over the same ``forward_full`` that inference uses.

Axis names: A micro-batches (gradient accumulation), B sequences, L window length (seq_len + 1).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxserve.config import ModelConfig
from jaxserve.models import forward_full
from jaxserve.train.config import TrainConfig


def make_optimizer(tc: TrainConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (no decay on norms/biases) with linear warm-up then cosine decay, after global-norm clipping."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup_steps, max(tc.steps, tc.warmup_steps + 1),
                                                  end_value=tc.lr * tc.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    opt = optax.chain(optax.clip_by_global_norm(tc.grad_clip),
                      optax.adamw(schedule, tc.b1, tc.b2, weight_decay=tc.weight_decay, mask=decay_mask))
    return opt, schedule


def token_nll(params: dict, config: ModelConfig, windows: jax.Array) -> jax.Array:
    """Next-token negative log-likelihood f32[B, L-1] of windows i32[B, L]."""
    logits = forward_full(params, config, windows[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])


def optimizer_fields(tc: TrainConfig) -> TrainConfig:
    """``tc`` with only the fields the optimizer depends on kept: a cache key for the compiled step."""
    return TrainConfig(steps=tc.steps, lr=tc.lr, min_lr_ratio=tc.min_lr_ratio, warmup_steps=tc.warmup_steps,
                       weight_decay=tc.weight_decay, b1=tc.b1, b2=tc.b2, grad_clip=tc.grad_clip)


@functools.lru_cache(maxsize=8)
def make_train_step(config: ModelConfig, tc: TrainConfig):
    """``step(params, opt_state, batch i32[A, B, L]) -> (params, opt_state, metrics)``, jitted, donating state.

    Cached on ``(config, optimizer_fields(tc))`` so runs with the same shapes reuse one compilation.
    """
    optimizer, _ = make_optimizer(tc)
    loss_fn = lambda params, w: token_nll(params, config, w).mean()

    def step(params, opt_state, batch):
        def micro(acc, w):
            loss, grads = jax.value_and_grad(loss_fn)(params, w)
            return jax.tree.map(jnp.add, acc, (loss, grads)), None

        zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        (loss, grads), _ = jax.lax.scan(micro, zero, batch)
        loss, grads = jax.tree.map(lambda x: x / batch.shape[0], (loss, grads))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1))


@functools.partial(jax.jit, static_argnames="config")
def _row_nll(params, config, windows):
    return token_nll(params, config, windows).sum(axis=-1)


def evaluate(params: dict, config: ModelConfig, windows: np.ndarray, batch_size: int = 8) -> dict:
    """Mean next-token NLL and perplexity over windows i32[W, L] (float64 accumulation on the host)."""
    total, n = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        padded = np.resize(chunk, (batch_size,) + chunk.shape[1:])  # one compiled shape for a short last batch
        total += float(np.asarray(_row_nll(params, config, padded), np.float64)[:len(chunk)].sum())
        n += chunk.shape[0] * (chunk.shape[1] - 1)
    mean = total / n
    return {"val_loss": mean, "val_ppl": float(np.exp(mean)), "val_tokens": n}
