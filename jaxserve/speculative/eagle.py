"""An EAGLE draft (Li et al. 2024): one decoder layer over the target's own hidden states.

Axis names: T packed tokens, B sequences, E hidden size, N the draft head's tokens, V vocabulary.

A small model that drafts from tokens alone must relearn what the target already computed; EAGLE's draft
reads the target's last hidden state instead. At position p its input is the embedding of token x_p and the
target's final-normed hidden f_{p-1} (the LM head's input that predicted x_p), projected from 2E to E
(``fc``); one decoder layer of the target's shape, attending over the draft's own paged K/V, and a norm give
f̂_p, and the target's LM head on f̂_p proposes x_{p+1}. Drafting γ tokens feeds f̂ back as the next
position's feature. The embedding and the head are the target's (tied for SmolLM2), so the draft owns only
fc, the layer and the norm; greedy rounds read the head cut to the draft's N most frequent tokens
(``DraftHead``, FR-Spec), sampled rounds the whole of it.

The draft's K/V at a position depend on the feature it was given, so positions drafted with f̂ and then
accepted are rewritten once their true features are known (``eagle_round`` does so after verifying: one
pass over the round's positions). Position 0 and the first position of a sequence whose earlier positions
came from the prefix cache get a zero feature (the training data does the same at position 0).
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
from jaxserve.layers import RMSNorm, dense, packed_head_logits, packed_logits, rope_tables
from jaxserve.models.transformer import DecoderLayer, layer_inv_freq
from jaxserve.speculative.draft_vocab import DraftHead

CONFIG_FILE, PARAMS_FILE, TOKENS_FILE = "eagle_config.json", "eagle_params.npz", "eagle_head_tokens.npy"


def eagle_config(target: ModelConfig, intermediate_size: int | None = None) -> ModelConfig:
    """The draft layer's config: the target's with one layer (and optionally a narrower MLP)."""
    return dataclasses.replace(target, num_layers=1, intermediate_size=intermediate_size or target.intermediate_size)


class EagleDraft(nn.Module):
    config: ModelConfig  # ``eagle_config(target)``
    attention_impl: str = "auto"

    @nn.compact
    def __call__(self, embeds: jax.Array, features: jax.Array, positions: jax.Array, kv_pool: KVPool | None = None,
                 meta=None):
        """embeds [..., E] (the target's embedding of x_p), features [..., E] (the target's f_{p-1}), positions
        i32[...] -> (f̂_p f32[..., E], the draft's pool with K/V at ``positions`` written; None without a pool)."""
        c = self.config
        dt = jnp.dtype(c.dtype)
        fc = dense(c.hidden_size, dt, "fc", matmul_dtype=c.matmul_dtype, kernel_init=nn.initializers.normal(0.02))
        x = fc(jnp.concatenate([embeds.astype(dt), features.astype(dt)], -1))
        cos_sin = rope_tables(positions, layer_inv_freq(c, 0))
        x, kv = DecoderLayer(c, self.attention_impl, 0, name="layers_0")(
            x, positions, cos_sin, None if kv_pool is None else kv_pool.layers[0], meta)
        out = RMSNorm(c.rms_norm_eps, dt, c.norm_unit_offset, name="norm")(x).astype(jnp.float32)
        return out, (None if kv_pool is None else kv_pool.replace(layers=(kv,)))


def draft_hidden(params: dict, config: ModelConfig, embeds, features, positions, kv_pool=None, meta=None,
                 attention_impl: str = "auto"):
    return EagleDraft(config, attention_impl).apply({"params": params}, embeds, features, positions, kv_pool, meta)


def init_eagle_params(config: ModelConfig, target_params: dict, key: jax.Array) -> dict:
    """fc random (normal 0.02), the layer a copy of the target's last, the norm the target's final norm."""
    e = config.hidden_size
    z = jnp.zeros((1, 1, e))
    params = EagleDraft(config).init(key, z, z, jnp.zeros((1, 1), jnp.int32))["params"]
    last = max(int(k.split("_")[1]) for k in target_params if k.startswith("layers_"))
    params = dict(params)
    params["layers_0"] = jax.tree.map(lambda a: jnp.array(a, copy=True), target_params[f"layers_{last}"])
    params["norm"] = {"scale": jnp.array(target_params["final_norm"]["scale"], copy=True)}
    return params


# ---- the target's embedding and head, in whichever form the runner holds them -----------------------------

def target_embed(target_params: dict, target_config: ModelConfig, tokens: jax.Array) -> jax.Array:
    """The target's input embedding of tokens i32[...] -> [..., E] (a packed tied head's columns, or the table)."""
    if "tied_head" in target_params:
        return target_params["tied_head"]["kernel"].columns(tokens)
    emb = target_params["embed"]["embedding"]
    x = jnp.take(emb, tokens, axis=0)
    if target_config.scale_embeddings:
        x = x * jnp.asarray(np.float32(target_config.hidden_size ** 0.5), x.dtype)
    return x


def target_head(target_params: dict, target_config: ModelConfig, hidden: jax.Array) -> jax.Array:
    """The target's LM head on hidden [B, E] -> logits f32[B, V] (the draft's whole-vocabulary distribution)."""
    c = target_config
    if "tied_head" in target_params:
        return packed_logits(target_params["tied_head"]["kernel"], hidden, jnp.float32)
    kernel = target_params["embed"]["embedding"].T if c.tie_word_embeddings else target_params["lm_head"]["kernel"]
    packed = packed_head_logits(kernel, hidden)  # an untied head a runner packed
    if packed is not None:
        return packed
    if not isinstance(kernel, jax.Array):
        raise ValueError(f"an EAGLE draft needs the target's LM head as an array, got {type(kernel).__name__}")
    return jnp.dot(hidden.astype(kernel.dtype), kernel, preferred_element_type=jnp.float32)


def eagle_head(target_params: dict, target_config: ModelConfig, token_ids) -> DraftHead:
    """The target's head cut to ``token_ids`` (the draft's N most frequent tokens) as a ``DraftHead``."""
    ids = np.unique(np.asarray(token_ids, np.int64))
    if ids.size == 0 or ids[0] < 0 or ids[-1] >= target_config.vocab_size:
        raise ValueError(f"EAGLE head token ids must lie in [0, {target_config.vocab_size}), got {ids.size} ids")
    if target_config.tie_word_embeddings and target_config.scale_embeddings:
        raise ValueError("EAGLE drafts do not support targets that scale their tied embedding")
    if target_config.tie_word_embeddings:
        rows = target_embed(target_params, target_config, jnp.asarray(ids, jnp.int32))
    else:
        rows = jnp.asarray(target_params["lm_head"]["kernel"])[:, ids].T
    return DraftHead(token_ids=jnp.asarray(ids, jnp.int32), kernel=jnp.asarray(rows).T)


# ---- files ------------------------------------------------------------------------------------------------

def save_eagle(path, config: ModelConfig, params: dict, head_tokens, info: dict | None = None) -> None:
    """Writes the draft (config + ``info``, params in bfloat16 bits, the head's token ids) into directory ``path``."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps({**dataclasses.asdict(config), "info": info or {}}, indent=1))
    flat = traverse_util.flatten_dict(jax.device_get(params), sep="/")
    np.savez(path / PARAMS_FILE, **{k: np.asarray(v, jnp.bfloat16).view(np.uint16) for k, v in flat.items()})
    np.save(path / TOKENS_FILE, np.asarray(head_tokens, np.int32))


def is_eagle(path) -> bool:
    return (pathlib.Path(path) / CONFIG_FILE).is_file()


def load_eagle(path, dtype: str | None = None) -> tuple[ModelConfig, dict, np.ndarray]:
    """(config, params in ``dtype`` (default: the config's), head token ids) from ``save_eagle``'s directory."""
    path = pathlib.Path(path)
    if not all((path / f).is_file() for f in (CONFIG_FILE, PARAMS_FILE, TOKENS_FILE)):
        raise ValueError(f"no EAGLE draft at {str(path)!r} (expected {CONFIG_FILE}, {PARAMS_FILE}, {TOKENS_FILE})")
    raw = json.loads((path / CONFIG_FILE).read_text())
    raw.pop("info", None)
    config = ModelConfig(**raw)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype)
    dt = jnp.dtype(config.dtype)
    with np.load(path / PARAMS_FILE) as f:
        params = traverse_util.unflatten_dict(
            {k: jnp.asarray(f[k].view(jnp.bfloat16)).astype(dt) for k in f.files}, sep="/")
    return config, params, np.load(path / TOKENS_FILE)
