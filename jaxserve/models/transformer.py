"""The decoder-only transformer family (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text and the MoE variants)
as pure functions.

Axis names: B batch, L sequence length, T packed tokens, V vocabulary, E hidden size.

Two entry points share one module tree and one params pytree:
- ``forward(params, config, tokens[T], positions[T], kv_pool, meta) -> (logits, kv_pool)``: the
  serving step over a packed batch, K/V written into and read from the paged pool;
- ``forward_full(params, config, tokens[B, L]) -> logits[B, L, V]``: plain causal forward with no
  cache, used by training and as the oracle in tests.

Per-layer attention follows the config: sliding-window layers (``ModelConfig.layer_window``) with their
own RoPE base (``rope_local_theta``), scaled RoPE (``rope_type``), Gemma's norms and embedding scale.

MoE configs (``num_experts > 0``) swap the MLP of their MoE layers for ``jaxserve.moe.MoEBlock``;
both entry points then take an optional ``router_state`` (the loss-free balancing biases, see
``jaxserve/moe/balancing.py``; zero when omitted).
"""
from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.cache.kv_pool import KVLayer, KVPool
from jaxserve.config import ModelConfig
from jaxserve.models.attention import AttentionMetadata, causal_attention, write_and_attend
from jaxserve.models.attention_backends import attention_backend
from jaxserve.layers import (RMSNorm, SwiGLU, dense, holds_packed, int8_logits, packed_logits, packed_residual, rope,
                             rope_inv_freq, rope_tables, tied_logits)
from jaxserve.moe.layer import MoEBlock
from jaxserve.moe.parallel import expert_parallel_routed
from jaxserve.moe.tensor_parallel import tensor_parallel_routed
from jaxserve.parallel.layout import TENSOR, Layout

_INIT = nn.initializers.normal(0.02)


def _dense(config: ModelConfig, features: int, bias: bool, name: str) -> nn.Dense:
    return dense(features, jnp.dtype(config.dtype), name, matmul_dtype=config.matmul_dtype, bias=bias,
                 kernel_init=_INIT)


def _norm(config: ModelConfig, name: str) -> RMSNorm:
    return RMSNorm(config.rms_norm_eps, jnp.dtype(config.dtype), config.norm_unit_offset, name=name)


def _local_rope(config: ModelConfig, layer: int) -> bool:
    """Whether decoder layer ``layer`` rotates with the local base ``rope_local_theta`` (a Gemma 3 sliding layer)."""
    return config.rope_local_theta is not None and config.layer_window(layer) is not None


def layer_inv_freq(config: ModelConfig, layer: int) -> jax.Array:
    """RoPE inverse frequencies f32[head_dim/2] of decoder layer ``layer``: a sliding layer with its own
    ``rope_local_theta`` (Gemma 3) is unscaled; every other layer uses ``rope_theta`` and ``rope_type``."""
    c = config
    if _local_rope(c, layer):
        return rope_inv_freq(c.head_dim, c.rope_local_theta)
    return rope_inv_freq(c.head_dim, c.rope_theta, c.rope_type, c.rope_factor, c.rope_low_freq_factor,
                         c.rope_high_freq_factor, c.rope_original_max_position)


class Attention(nn.Module):
    config: ModelConfig
    attention_impl: str
    layer_idx: int = 0
    layout: Layout | None = None

    @nn.compact
    def __call__(self, x, positions, rope_cos_sin: tuple[jax.Array, jax.Array], kv: KVLayer | None = None,
                 meta: AttentionMetadata | None = None, residual: jax.Array | None = None):
        """x [..., E], or the input norm's ``NormedRows`` (the q/k/v projections take it). ``rope_cos_sin``: RoPE's
        tables for ``positions`` at this layer's frequencies (``rope_tables``), which the model computes once per
        forward for all its layers. ``residual``: the stream the output is added to (the result is then their sum,
        fused into the o projection's GEMM where its kernel is packed)."""
        c = self.config
        lead = x.shape[:-1]
        nq, nkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        if self.has_variable("params", "qkv_proj"):  # fused by a runner (jaxserve.kernels.cpu.packed.FUSIONS)
            q, k, v = jnp.split(_dense(c, nq + 2 * nkv, c.qkv_bias, "qkv_proj")(x), [nq, nq + nkv], axis=-1)
        else:
            q, k, v = (_dense(c, n, c.qkv_bias, name)(x) for n, name in ((nq, "q_proj"), (nkv, "k_proj"),
                                                                          (nkv, "v_proj")))
        q = q.reshape(*lead, c.num_heads, c.head_dim)
        k, v = (t.reshape(*lead, c.num_kv_heads, c.head_dim) for t in (k, v))
        if c.qk_norm:
            q, k = _norm(c, "q_norm")(q), _norm(c, "k_norm")(k)
        q, k = (rope(t, positions, c.rope_theta, tables=rope_cos_sin) for t in (q, k))
        opts = dict(sliding_window=c.layer_window(self.layer_idx),
                    sm_scale=None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5)
        if kv is None:
            o = causal_attention(q, k, v, **opts)
        else:
            o, kv = write_and_attend(q, k, v, kv, meta, attention_backend(self.attention_impl), self.layout, **opts)
        o = o.reshape(*lead, c.num_heads * c.head_dim)
        fused = packed_residual(self, "o_proj", o, residual)
        if fused is not None:
            return fused, kv
        out = _dense(c, c.hidden_size, c.o_bias, "o_proj")(o)
        return (out if residual is None else residual + out), kv


class DecoderLayer(nn.Module):
    config: ModelConfig
    attention_impl: str
    layer_idx: int = 0
    layout: Layout | None = None

    @nn.compact
    def __call__(self, x, positions, rope_cos_sin, kv=None, meta=None):
        c, dt = self.config, jnp.dtype(self.config.dtype)
        attn = Attention(c, self.attention_impl, self.layer_idx, self.layout, name="attn")
        if c.sandwich_norms:  # Gemma 2/3: the attention and MLP outputs are normed before the residual adds
            h, kv = attn(_norm(c, "input_norm")(x), positions, rope_cos_sin, kv, meta)
            x = x + _norm(c, "post_attention_norm")(h)
            return x + _norm(c, "post_feedforward_norm")(self._mlp(c, dt)(_norm(c, "pre_feedforward_norm")(x))), kv
        # x + attn(...), x + mlp(...): the adds go into the projections, and the norms' last multiplies into the
        # packed GEMMs reading them (NormedRows), where the kernels are packed
        h = _norm(c, "input_norm")(x, deferred=holds_packed(self, "attn", "qkv_proj"))
        x, kv = attn(h, positions, rope_cos_sin, kv, meta, residual=x)
        mlp = self._mlp(c, dt)
        if isinstance(mlp, SwiGLU):
            return mlp(_norm(c, "post_attention_norm")(x, deferred=holds_packed(self, "mlp", "gate_up_proj")),
                       residual=x), kv
        return x + mlp(_norm(c, "post_attention_norm")(x)), kv

    def _mlp(self, c: ModelConfig, dt):
        if c.is_moe_layer(self.layer_idx):  # router stats are sown into "moe_stats"
            routed, lo = None, self.layout
            if lo is not None and lo.expert_parallel:  # experts split over devices, (ragged) all_to_all dispatch
                routed = partial(expert_parallel_routed, mesh=lo.mesh, axes=lo.expert_axes, dispatch=lo.moe_dispatch)
            elif lo is not None and lo.tensor_size > 1:  # every expert split on its intermediate dim
                routed = partial(tensor_parallel_routed, mesh=lo.mesh, axis=TENSOR)
            return lambda h: MoEBlock(c, routed, name="mlp")(h)[0]
        return SwiGLU(c.hidden_size, c.intermediate_size, dt, c.matmul_dtype, c.hidden_act, name="mlp")


class Transformer(nn.Module):
    config: ModelConfig
    attention_impl: str = "auto"
    layout: Layout | None = None  # a device mesh (jaxserve.parallel.layout); None: one device
    hidden_only: bool = False  # return the final-normed hidden states f32[..., E] instead of logits (a loss over
    # part of the vocabulary computes its own logits: jaxserve.train.loss_focus)

    @nn.compact
    def __call__(self, tokens, positions, kv_pool: KVPool | None = None, meta=None, logits_indices=None):
        c, dt = self.config, jnp.dtype(self.config.dtype)
        # a runner with the CPU kernels holds a tied bf16 embedding packed as the LM head
        # (kernels.cpu.packed.pack_tied_head)
        packed = self.get_variable("params", "tied_head")["kernel"] if c.tie_word_embeddings and self.has_variable(
            "params", "tied_head") else None
        # EngineConfig.lm_head_quantization="int8": the head in int8 (kernels.cpu.int8_head.with_int8_head)
        int8_head = self.get_variable("params", "int8_head")["kernel"] if self.has_variable(
            "params", "int8_head") else None
        if packed is None:
            embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=dt, param_dtype=dt, embedding_init=_INIT, name="embed")
            x = embed(tokens)
        else:
            x = packed.columns(tokens).astype(dt)
        if c.scale_embeddings:  # Gemma: the scale rounded to the embedding dtype, as HF does
            x = x * jnp.asarray(np.float32(c.hidden_size ** 0.5), dt)
        new_pool = []
        cos_sin = {}  # RoPE's tables, once per forward for each set of frequencies (local, global)
        for i in range(c.num_layers):  # unrolled: each layer's pages are a separate donated buffer
            if _local_rope(c, i) not in cos_sin:
                cos_sin[_local_rope(c, i)] = rope_tables(positions, layer_inv_freq(c, i))
            x, kv = DecoderLayer(c, self.attention_impl, i, self.layout, name=f"layers_{i}")(
                x, positions, cos_sin[_local_rope(c, i)], None if kv_pool is None else kv_pool.layers[i], meta)
            new_pool.append(kv)
        x = _norm(c, "final_norm")(x)
        if logits_indices is not None:
            x = x[logits_indices]
        if self.hidden_only:
            return x.astype(jnp.float32), (None if kv_pool is None else kv_pool.replace(layers=tuple(new_pool)))
        if int8_head is not None:
            logits = int8_logits(int8_head, x).astype(dt)
        elif packed is not None:  # rounded to the embedding's dtype, as tied_logits's product is
            logits = packed_logits(packed, x, dt)
        else:
            logits = tied_logits(embed, x) if c.tie_word_embeddings else _dense(c, c.vocab_size, False, "lm_head")(x)
        logits = logits.astype(jnp.float32)
        if c.final_logit_softcap is not None:
            logits = c.final_logit_softcap * jnp.tanh(logits / c.final_logit_softcap)
        return logits, (None if kv_pool is None else kv_pool.replace(layers=tuple(new_pool)))


def init_params(config: ModelConfig, key: jax.Array) -> dict:
    """Random params (normal(0.02) weights, unit norms), in ``config.dtype``."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    return Transformer(config).init(key, tokens, tokens)["params"]


def param_shapes(config: ModelConfig) -> dict:
    """The params pytree as ``jax.ShapeDtypeStruct``s, computed without allocating."""
    return jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))


def forward(params: dict, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
            kv_pool: KVPool, meta: AttentionMetadata, *, attention_impl: str = "auto",
            logits_indices: jax.Array | None = None, router_state: dict | None = None,
            layout: Layout | None = None, hidden_only: bool = False) -> tuple[jax.Array, KVPool]:
    """Serving step over a packed batch.

    tokens, positions: i32[T]; kv_pool: the paged pool, in the layout ``attention_impl`` reads; meta: where each
    sequence's K/V live. Returns ``(logits f32[T or len(logits_indices), V], kv_pool)`` with this
    step's K/V written into the pool. ``layout``: the device mesh the params and pool are placed on
    (tensor-parallel attention per shard, expert-parallel MoE), or None for one device. ``hidden_only``: the
    final-normed hidden states f32[..., E] instead of the logits (a caller that applies the head itself).
    """
    return Transformer(config, attention_impl, layout, hidden_only).apply(
        _variables(params, router_state), tokens, positions, kv_pool, meta, logits_indices)


def forward_full(params: dict, config: ModelConfig, tokens: jax.Array,
                 positions: jax.Array | None = None, router_state: dict | None = None) -> jax.Array:
    """Causal forward with no cache: tokens i32[B, L] -> logits f32[B, L, V]."""
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits, _ = Transformer(config).apply(_variables(params, router_state), tokens, positions)
    return logits


def forward_hidden(params: dict, config: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Causal forward with no cache: tokens i32[B, L] -> final-normed hidden states f32[B, L, E] (no LM head)."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = Transformer(config, hidden_only=True).apply({"params": params}, tokens, positions)
    return hidden


def _variables(params: dict, router_state: dict | None) -> dict:
    return {"params": params} if router_state is None else {"params": params, "router_state": router_state}
