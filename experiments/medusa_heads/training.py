"""Training Medusa-1 heads on a frozen target's hidden states (Cai et al. 2024, Medusa-1 recipe).

Axis names: B windows, T positions, K heads, V vocabulary, E hidden size.

Head k (1-based) at position t is trained with cross-entropy against token t+1+k: either the
corpus token (``labels="corpus"``, Medusa-1 on its fine-tuning data) or the target's own argmax
for that token given the true prefix (``labels="target"``, the self-distillation of the Medusa
paper, §2.3.2): greedy verification accepts exactly when a head guesses the target's argmax.
The heads' losses are weighted λ_k = decay^k (Medusa-1 uses 0.8), and the target stays frozen
(its outputs are computed under ``stop_gradient``). Optimiser: optax AdamW, cosine decay.

The target's outputs for a window (``target_outputs``: the hidden states the heads read and both
label sets) do not depend on the heads, so they can be computed once per window and the steps
train the heads alone (``heads_step``); ``train_step`` recomputes them every step.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxserve.config import ModelConfig
from jaxserve.speculative.hidden import full_hidden
from jaxserve.speculative.medusa import MedusaConfig, medusa_logits


def window_length(num_positions: int, heads_config: MedusaConfig) -> int:
    """Tokens per training window: T positions plus the K + 1 tokens their furthest labels need."""
    return num_positions + heads_config.num_heads + 1


def corpus_labels(tokens: jax.Array, t: int, k: int) -> jax.Array:
    """i32[B, T, K]: the token head j+1 must predict at position i, tokens[i + 2 + j]."""
    return jnp.stack([tokens[:, 2 + j:2 + j + t] for j in range(k)], axis=2)


def target_labels(logits: jax.Array, t: int, k: int) -> jax.Array:
    """i32[B, T, K]: the target's argmax for token i + 2 + j given the true prefix (logits f32[B, >= T+K, V])."""
    guess = jnp.argmax(logits, -1)  # guess[:, i] is the target's prediction of token i + 1
    return jnp.stack([guess[:, 1 + j:1 + j + t] for j in range(k)], axis=2)


def medusa_loss(heads_params: dict, heads_config: MedusaConfig, hidden: jax.Array, labels: jax.Array,
                decay: float = 0.8) -> tuple[jax.Array, jax.Array]:
    """hidden f32[B, T, E], labels i32[B, T, K] -> (weighted cross-entropy, top-1 accuracy f32[K])."""
    k = heads_config.num_heads
    logits = medusa_logits(heads_params, heads_config, hidden)  # [B, T, K, V]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean((0, 1))  # [K]
    weights = decay ** jnp.arange(1, k + 1, dtype=jnp.float32)
    accuracy = (jnp.argmax(logits, -1) == labels).mean((0, 1))
    return jnp.sum(weights * ce), accuracy


def make_optimizer(learning_rate: float, steps: int, warmup: int, weight_decay: float = 0.0):
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup, 1), max(steps, warmup + 1))
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=weight_decay))


def _target_outputs(target_params, tokens, target_config: ModelConfig, k: int):
    t = tokens.shape[1] - k - 1
    logits, hidden = jax.lax.stop_gradient(full_hidden(target_params, target_config, tokens[:, :t + k]))
    return hidden[:, :t], target_labels(logits, t, k), corpus_labels(tokens, t, k)


@partial(jax.jit, static_argnames=("target_config", "num_heads"))
def target_outputs(target_params, tokens, *, target_config: ModelConfig, num_heads: int):
    """Windows i32[B, T+K+1] -> (hidden f32[B, T, E], target labels i32[B, T, K], corpus labels i32[B, T, K])."""
    return _target_outputs(target_params, tokens, target_config, num_heads)


def _heads_update(heads_params, opt_state, hidden, labels, heads_config, optimizer, decay):
    (loss, acc), grads = jax.value_and_grad(medusa_loss, has_aux=True)(heads_params, heads_config, hidden, labels,
                                                                       decay)
    updates, opt_state = optimizer.update(grads, opt_state, heads_params)
    return optax.apply_updates(heads_params, updates), opt_state, loss, acc


@partial(jax.jit, static_argnames=("heads_config", "optimizer", "decay"), donate_argnums=(0, 1))
def heads_step(heads_params, opt_state, hidden, labels, *, heads_config: MedusaConfig, optimizer,
               decay: float = 0.8):
    """One AdamW step on precomputed hidden f32[B, T, E] and labels i32[B, T, K]; (params, opt_state, loss, acc)."""
    return _heads_update(heads_params, opt_state, hidden, labels, heads_config, optimizer, decay)


@partial(jax.jit, static_argnames=("target_config", "heads_config", "optimizer", "decay", "labels"),
         donate_argnums=(0, 1))
def train_step(heads_params, opt_state, target_params, tokens, *, target_config: ModelConfig,
               heads_config: MedusaConfig, optimizer, decay: float = 0.8, labels: str = "target"):
    """One AdamW step on a batch of windows i32[B, T+K+1]; returns (params, opt_state, loss, accuracy f32[K])."""
    hidden, target_y, corpus_y = _target_outputs(target_params, tokens, target_config, heads_config.num_heads)
    return _heads_update(heads_params, opt_state, hidden, target_y if labels == "target" else corpus_y,
                         heads_config, optimizer, decay)


@partial(jax.jit, static_argnames=("heads_config",))
def head_hits(heads_params, hidden, labels_a, labels_b, *, heads_config: MedusaConfig):
    """Top-1 hits i32[2, K] of each head against two label sets i32[B, T, K] (hidden f32[B, T, E])."""
    guesses = jnp.argmax(medusa_logits(heads_params, heads_config, hidden), -1)  # [B, T, K]
    return jnp.stack([(guesses == labels_a).sum((0, 1)), (guesses == labels_b).sum((0, 1))])


def target_chunks(target_params, windows, *, target_config: ModelConfig, num_heads: int, chunk: int) -> list:
    """``target_outputs`` of windows i32[W, T+K+1], ``chunk`` windows at a time: a list of (hidden, target labels,
    corpus labels) triples, each [<= chunk, T, ...] (the target's logits of a chunk are f32[chunk, T+K, V])."""
    return [target_outputs(target_params, windows[lo:lo + chunk], target_config=target_config, num_heads=num_heads)
            for lo in range(0, len(windows), chunk)]


def evaluate(heads_params, chunks: list, *, heads_config: MedusaConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per-head top-1 accuracy f32[K] against the corpus, and against the target's own argmax one step on
    (head 1's label shifted: how often head k's guess equals what the target itself predicts there), over the
    ``target_chunks`` of the evaluation windows."""
    hits = sum(np.asarray(head_hits(heads_params, hidden, corpus_y, target_y, heads_config=heads_config))
               for hidden, target_y, corpus_y in chunks)
    positions = sum(hidden.shape[0] * hidden.shape[1] for hidden, _, _ in chunks)
    return hits[0] / positions, hits[1] / positions
