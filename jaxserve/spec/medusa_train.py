"""Training Medusa-1 heads on a frozen target's hidden states (Cai et al. 2024, Medusa-1 recipe).

Axis names: B windows, T positions, K heads, V vocabulary, E hidden size.

Head k (1-based) at position t is trained with cross-entropy against the corpus token t+1+k;
the heads' losses are weighted λ_k = decay^k (Medusa-1 uses 0.8), and the target stays frozen
(its hidden states are computed under ``stop_gradient``). Optimiser: optax AdamW, cosine decay.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax

from jaxserve.config import ModelConfig
from jaxserve.spec.hidden import full_hidden
from jaxserve.spec.medusa import MedusaConfig, medusa_logits


def window_length(num_positions: int, heads_config: MedusaConfig) -> int:
    """Tokens per training window: T positions plus the K + 1 tokens their furthest labels need."""
    return num_positions + heads_config.num_heads + 1


def medusa_loss(heads_params: dict, heads_config: MedusaConfig, hidden: jax.Array, tokens: jax.Array,
                decay: float = 0.8) -> tuple[jax.Array, jax.Array]:
    """hidden f32[B, T, E] at positions 0..T-1 of tokens i32[B, T+K+1] -> (weighted loss, top-1 accuracy f32[K])."""
    t, k = hidden.shape[1], heads_config.num_heads
    logits = medusa_logits(heads_params, heads_config, hidden)  # [B, T, K, V]
    labels = jnp.stack([tokens[:, 2 + j:2 + j + t] for j in range(k)], axis=2)  # head j+1 predicts t+2+j
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean((0, 1))  # [K]
    weights = decay ** jnp.arange(1, k + 1, dtype=jnp.float32)
    accuracy = (jnp.argmax(logits, -1) == labels).mean((0, 1))
    return jnp.sum(weights * ce), accuracy


def make_optimizer(learning_rate: float, steps: int, warmup: int, weight_decay: float = 0.0):
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup, 1), max(steps, warmup + 1))
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=weight_decay))


@partial(jax.jit, static_argnames=("target_config", "heads_config", "optimizer", "decay"), donate_argnums=(0, 1))
def train_step(heads_params, opt_state, target_params, tokens, *, target_config: ModelConfig,
               heads_config: MedusaConfig, optimizer, decay: float = 0.8):
    """One AdamW step on a batch of windows i32[B, T+K+1]; returns (params, opt_state, loss, accuracy f32[K])."""
    t = tokens.shape[1] - heads_config.num_heads - 1
    _, hidden = full_hidden(target_params, target_config, tokens[:, :t])
    hidden = jax.lax.stop_gradient(hidden)
    (loss, acc), grads = jax.value_and_grad(medusa_loss, has_aux=True)(heads_params, heads_config, hidden, tokens,
                                                                       decay)
    updates, opt_state = optimizer.update(grads, opt_state, heads_params)
    return optax.apply_updates(heads_params, updates), opt_state, loss, acc


@partial(jax.jit, static_argnames=("target_config", "heads_config"))
def evaluate(heads_params, target_params, tokens, *, target_config: ModelConfig, heads_config: MedusaConfig):
    """Per-head top-1 accuracy f32[K] against the corpus, and against the target's own argmax one step on
    (head 1's label shifted: how often head k's guess equals what the target itself predicts there)."""
    t = tokens.shape[1] - heads_config.num_heads - 1
    logits, hidden = full_hidden(target_params, target_config, tokens)
    _, acc = medusa_loss(heads_params, heads_config, hidden[:, :t], tokens)
    target_next = jnp.argmax(logits, -1)  # [B, L]: the target's prediction of token i+1 given the true prefix
    guesses = jnp.argmax(medusa_logits(heads_params, heads_config, hidden[:, :t]), -1)  # [B, T, K]
    agree = jnp.stack([guesses[:, :, j] == target_next[:, 1 + j:1 + j + t] for j in range(heads_config.num_heads)], -1)
    return acc, agree.mean((0, 1))
