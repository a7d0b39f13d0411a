"""Medusa-1 heads (Cai et al. 2024) as a speculative proposer behind the same round interface.

Axis names: B sequences, G draft tokens (γ), K heads, E hidden size, V vocabulary.

Head k (1-based) reads the frozen target's last hidden state h_t (the LM head's input at
position t, whose logits give token t+1) and predicts token t+1+k: a residual block
x + SiLU(W x) (W zero-initialised, so it starts as the identity) then its own linear map to the
vocabulary (initialised from the target's LM head), as in Medusa-1.

A round proposes the top-1 token of heads 1..γ along a single chain. The proposal is
deterministic, so its q is one-hot and the exact rejection rule applies unchanged (accept x with
probability p(x); correct from p with x removed). The proposer's state is one hidden vector per
sequence, the target's hidden at the position before ``last_tokens``; the verify pass returns the
next one, so the heads cost no extra target pass.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxserve.cache.kv_pool import KVPool
from jaxserve.config import ModelConfig
from jaxserve.parallel.layout import Layout
from jaxserve.speculative.rejection import round_uniforms
from jaxserve.speculative.round import RoundInputs, RoundOutputs, accept_and_advance, verify_with_hidden

CONFIG_FILE, PARAMS_FILE = "medusa_config.json", "medusa_params.npz"


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int = 4  # K: head k predicts token t+1+k
    num_layers: int = 1  # residual blocks per head


class MedusaHeads(nn.Module):
    config: MedusaConfig

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        """hidden f32[..., E] -> logits f32[..., K, V]."""
        c = self.config
        out = []
        for k in range(c.num_heads):
            x = hidden.astype(jnp.float32)
            for j in range(c.num_layers):
                x = x + nn.silu(nn.Dense(c.hidden_size, kernel_init=nn.initializers.zeros, name=f"res_{k}_{j}")(x))
            out.append(nn.Dense(c.vocab_size, use_bias=False, name=f"out_{k}")(x))
        return jnp.stack(out, axis=-2)


def init_medusa_params(config: MedusaConfig, target_params: dict, target_config: ModelConfig) -> dict:
    """Identity residual blocks and every output map a copy of the target's LM head."""
    params = MedusaHeads(config).init(jax.random.key(0), jnp.zeros((1, config.hidden_size)))["params"]
    head = target_params["embed"]["embedding"].T if target_config.tie_word_embeddings \
        else target_params["lm_head"]["kernel"]
    # a fresh copy per head: one shared buffer could not be donated to a training step
    return {name: ({"kernel": jnp.array(head, jnp.float32, copy=True)} if name.startswith("out_") else p)
            for name, p in params.items()}


def medusa_logits(params: dict, config: MedusaConfig, hidden: jax.Array) -> jax.Array:
    return MedusaHeads(config).apply({"params": params}, hidden)


def medusa_propose(params: dict, config: MedusaConfig, hidden: jax.Array, gamma: int) -> jax.Array:
    """hidden f32[B, E] -> the single chain of top-1 tokens i32[B, G] of heads 1..G."""
    return jnp.argmax(medusa_logits(params, config, hidden)[:, :gamma], axis=-1).astype(jnp.int32)


def medusa_round(target_params: dict, heads_params: dict, target_pool: KVPool, inputs: RoundInputs,
                 hidden: jax.Array, *, target_config: ModelConfig, heads_config: MedusaConfig, gamma: int,
                 attention_impl: str = "auto", layout: Layout | None = None) -> RoundOutputs:
    """``spec_round`` with Medusa proposals from hidden f32[B, E] (the target's hidden at positions - 1).

    The result's ``hidden`` is the next round's f32[B, E] (unchanged for inactive rows).
    """
    s = inputs.sampling
    u = round_uniforms(s.seed, s.index, inputs.positions + 1, gamma, target_config.vocab_size,
                       jnp.all(s.temperature <= 0))
    x = medusa_propose(heads_params, heads_config, hidden, gamma)
    logits, hid, target_pool = verify_with_hidden(target_params, target_config, target_pool, inputs, x,
                                                  attention_impl, layout)
    r = accept_and_advance(inputs, x, None, logits, u, target_pool, None)
    # the hidden at L + n produced the new last token: the heads read it next round
    nxt = hid[jnp.arange(x.shape[0]), r.num_accepted]
    return r.replace(hidden=jnp.where(inputs.active[:, None], nxt, hidden))


def save_heads(path: str | pathlib.Path, config: MedusaConfig, params: dict, info: dict | None = None) -> None:
    """Writes ``medusa_config.json`` (config + ``info``) and ``medusa_params.npz`` into directory ``path``."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps({**dataclasses.asdict(config), "info": info or {}}, indent=1))
    flat = traverse_util.flatten_dict(jax.device_get(params), sep="/")
    np.savez(path / PARAMS_FILE, **{k: np.asarray(v, np.float32) for k, v in flat.items()})


def load_heads(path: str | pathlib.Path) -> tuple[MedusaConfig, dict]:
    """Reads heads written by ``save_heads``; ValueError naming the directory if they are not there."""
    path = pathlib.Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / PARAMS_FILE).is_file():
        raise ValueError(f"no medusa heads at {str(path)!r} (expected {CONFIG_FILE} and {PARAMS_FILE}); "
                         "train them with python -m experiments.medusa_heads")
    raw = json.loads((path / CONFIG_FILE).read_text())
    raw.pop("info", None)
    with np.load(path / PARAMS_FILE) as f:
        params = traverse_util.unflatten_dict({k: jnp.asarray(f[k]) for k in f.files}, sep="/")
    return MedusaConfig(**raw), params
