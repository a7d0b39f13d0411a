"""The jitted training step and evaluation, over the same ``forward_full`` that inference uses.

Axis names: A micro-batches (gradient accumulation), B sequences, L window length (seq_len + 1),
E experts.

Dense and MoE models share one step. An MoE model also carries ``router_state`` (the loss-free
balancing selection biases, ``jaxserve/moe/balancing.py``): the step sums each MoE layer's expert
load over the micro-batches and, with ``balancing="loss_free"``, updates the biases once per
optimizer step, outside the gradient. A dense model's ``router_state`` is ``{}``.

Distillation (``distill_from``): a frozen teacher's logits on the same windows are the soft
targets; the loss is ``w * KL(teacher || model) + (1 - w) * cross-entropy``, while the logged
``loss`` stays the data cross-entropy (comparable with undistilled runs) and ``kl`` is logged too.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxserve.config import ModelConfig
from jaxserve.moe.balancing import layer_loads, max_violation, update_router_state
from jaxserve.models import forward_full
from jaxserve.models.likelihood import nll_and_stats, token_nll
from jaxserve.train.config import TrainConfig
from jaxserve.train.loss_focus import focused_nll


def make_optimizer(tc: TrainConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (no decay on norms/biases) with linear warm-up then cosine decay, after global-norm clipping."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup_steps, max(tc.steps, tc.warmup_steps + 1),
                                                  end_value=tc.lr * tc.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    opt = optax.chain(optax.clip_by_global_norm(tc.grad_clip),
                      optax.adamw(schedule, tc.b1, tc.b2, weight_decay=tc.weight_decay, mask=decay_mask))
    return opt, schedule


def optimizer_fields(tc: TrainConfig) -> TrainConfig:
    """``tc`` with only the fields the compiled step depends on kept: a cache key for it."""
    return TrainConfig(steps=tc.steps, lr=tc.lr, min_lr_ratio=tc.min_lr_ratio, warmup_steps=tc.warmup_steps,
                       weight_decay=tc.weight_decay, b1=tc.b1, b2=tc.b2, grad_clip=tc.grad_clip,
                       balancing=tc.balancing, bias_rate=tc.bias_rate, distill_weight=tc.distill_weight)


def distill_loss(logits: jax.Array, teacher_logits: jax.Array, targets: jax.Array, weight: float):
    """``(loss, (nll, kl))``: ``weight * KL(teacher || model) + (1 - weight) * NLL``, each a mean over
    tokens; logits f32[B, L, V], targets i32[B, L]."""
    logp, teacher_logp = jax.nn.log_softmax(logits), jax.nn.log_softmax(teacher_logits)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()
    kl = jnp.sum(jnp.exp(teacher_logp) * (teacher_logp - logp), axis=-1).mean()
    return weight * kl + (1 - weight) * nll, (nll, kl)


@functools.lru_cache(maxsize=8)
def make_train_step(config: ModelConfig, tc: TrainConfig, teacher_config: ModelConfig | None = None):
    """``step(params, router_state, opt_state, batch i32[A, B, L], teacher_params, mask=None, head=None) ->
    (params, router_state, opt_state, metrics)``, jitted, donating the state; ``teacher_params`` is None unless
    distilling (then ``teacher_config`` is the teacher's); ``mask`` bool[A, B, L] and ``head``
    (``loss_focus.HeadVocab``) focus a draft's loss (``loss_focus.focused_nll``). Metrics: ``loss`` (the
    data cross-entropy, over the counted targets when focused), ``grad_norm``; ``kl`` when distilling; for
    MoE ``max_vio`` (MaxVio of this step's load, averaged over MoE layers).

    Cached on ``(config, optimizer_fields(tc), teacher_config)`` so runs with the same shapes reuse one
    compilation.
    """
    optimizer, _ = make_optimizer(tc)
    moe = config.num_experts > 0

    def loss_fn(params, router_state, w, teacher_params, mask, head):
        if mask is not None or head is not None:  # a draft's focused loss (loss_focus; dense, undistilled)
            nll = focused_nll(params, config, w, mask, head)
            return nll, ({}, nll, jnp.zeros(()))
        if teacher_config is not None:
            teacher_logits = jax.lax.stop_gradient(forward_full(teacher_params, teacher_config, w[:, :-1]))
            loss, (nll, kl) = distill_loss(forward_full(params, config, w[:, :-1]), teacher_logits, w[:, 1:],
                                           tc.distill_weight)
            return loss, ({}, nll, kl)
        if not moe:
            nll = token_nll(params, config, w).mean()
            return nll, ({}, nll, jnp.zeros(()))
        nll, stats = nll_and_stats(params, router_state, config, w)
        return nll.mean(), (layer_loads(stats), nll.mean(), jnp.zeros(()))

    def step(params, router_state, opt_state, batch, teacher_params, mask=None, head=None):
        def micro(acc, wm):
            w, m = wm
            (_, (loads, nll, kl)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, router_state, w,
                                                                                     teacher_params, m, head)
            return jax.tree.map(jnp.add, acc, (nll, kl, grads, loads)), None

        no_load = {name: jnp.zeros(config.num_experts, jnp.float32) for name in router_state}
        zero = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params),
                no_load)
        (loss, kl, grads, loads), _ = jax.lax.scan(micro, zero, (batch, mask))
        loss, kl, grads = jax.tree.map(lambda x: x / batch.shape[0], (loss, kl, grads))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads)}
        if teacher_config is not None:
            metrics["kl"] = kl
        if moe:
            metrics["max_vio"] = jnp.mean(jnp.stack([max_violation(v) for v in loads.values()]))
            if tc.balancing == "loss_free":
                router_state = update_router_state(router_state, loads, tc.bias_rate)
        return optax.apply_updates(params, updates), router_state, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1, 2))


@functools.partial(jax.jit, static_argnames="config")
def _row_nll(params, config, windows, router_state):
    return token_nll(params, config, windows, router_state).sum(axis=-1)


def evaluate(params: dict, config: ModelConfig, windows: np.ndarray, batch_size: int = 8,
             router_state: dict | None = None) -> dict:
    """Mean next-token NLL and perplexity over windows i32[W, L] (float64 accumulation on the host).

    ``router_state``: an MoE model's loss-free balancing biases (None: zero biases)."""
    total, n = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        padded = np.resize(chunk, (batch_size,) + chunk.shape[1:])  # one compiled shape for a short last batch
        total += float(np.asarray(_row_nll(params, config, padded, router_state or None), np.float64)[:len(chunk)].sum())
        n += chunk.shape[0] * (chunk.shape[1] - 1)
    mean = total / n
    return {"val_loss": mean, "val_ppl": float(np.exp(mean)), "val_tokens": n}
