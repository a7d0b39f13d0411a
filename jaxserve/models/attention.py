"""Attention for the model family: the paged-cache path and the full-sequence oracle.

``AttentionMetadata`` carries everything a step needs to find a sequence's K/V in the pool;
``attend`` is the single dispatch point where the implementations (``jaxserve.models.attention_backends``:
Pallas kernels, plain XLA, the reference oracle) plug in.

Axis names: B sequences, T packed tokens, H query heads, K kv heads, D head dim, M pages per
sequence.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from jaxserve.cache.kv_pool import KVLayer
from jaxserve.models.attention_backends import AttentionBackend
from jaxserve.parallel.layout import Layout


@struct.dataclass
class AttentionMetadata:
    slot_mapping: jax.Array  # i32[T]: flat pool slot to write each new token's K/V; < 0 = padding
    block_tables: jax.Array  # i32[B, M]
    context_lens: jax.Array  # i32[B]: cached + new tokens, after this step
    cu_q_lens: jax.Array  # i32[B+1]: sequence b owns packed rows cu_q_lens[b]:cu_q_lens[b+1]
    decode_only: bool = struct.field(pytree_node=False, default=False)  # every q_len is 1 and T == B
    # every sequence has exactly this many new tokens (T == B * uniform_q_len): lets the XLA
    # reference gather each sequence's pages once instead of once per query token
    uniform_q_len: int | None = struct.field(pytree_node=False, default=None)
    # at most this many sequences have more than one new token (the scheduler's max_num_partial_prefills):
    # lets the XLA path run single-token rows through its decode body and build fewer query tiles
    max_chunks: int | None = struct.field(pytree_node=False, default=None)
    # with uniform_q_len: every sequence's new tokens start at position 0 (nothing was cached before
    # this step), so the step's own K/V are all the keys there are: ``attend`` skips the pool
    fresh: bool = struct.field(pytree_node=False, default=False)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, layer: KVLayer, meta: AttentionMetadata,
           backend: AttentionBackend, *, sliding_window: int | None = None,
           sm_scale: float | None = None) -> jax.Array:
    """This step's queries q [T, H, D] against everything they may see -> [T, H, D].

    k, v [T, K, D] are this step's new keys and values, already written into ``layer``. A fresh
    uniform batch (``meta.fresh``: whole prompts, nothing cached) attends to them directly with
    ``causal_attention``: no gather through the block table, and a Lp-wide score matrix instead of
    the table's M*S (a 64-token prompt in a 9-page table: 64 keys instead of 144). Everything else
    reads the pool through ``backend``. sliding_window: a token at position p sees keys in
    (p - sliding_window, p] only (None: all up to p). sm_scale: the score scale (None: head_dim ** -0.5).
    """
    kw = dict(sliding_window=sliding_window, sm_scale=sm_scale)
    if meta.fresh:
        if meta.uniform_q_len is None:
            raise ValueError("AttentionMetadata.fresh needs uniform_q_len (rows grouped by sequence)")
        rows = lambda x: x.reshape(-1, meta.uniform_q_len, *x.shape[1:])  # noqa: E731
        return causal_attention(rows(q), rows(k), rows(v), **kw).reshape(q.shape)
    return backend.read(q, layer, meta, **kw)


def write_and_attend(q: jax.Array, k: jax.Array, v: jax.Array, layer: KVLayer, meta: AttentionMetadata,
                     backend: AttentionBackend, layout: Layout | None = None, **opts) -> tuple[jax.Array, KVLayer]:
    """Writes this step's k, v [T, K, D] into ``layer`` and attends q [T, H, D] -> ([T, H, D], layer).

    With a ``layout`` the write and the read run per tensor shard inside ``shard_map``: each device holds
    H/T heads, K/T KV heads and its slice of the pages, the metadata replicated, so no shard ever
    sees (or gathers) another's K/V. ``opts``: ``attend``'s sliding_window and sm_scale.
    """
    def local(q, k, v, layer, meta):
        fused = backend.write_and_read(q, k, v, layer, meta, **opts)
        if fused is not None:
            return fused
        layer = backend.write(layer, k, v, meta.slot_mapping)
        return attend(q, k, v, layer, meta, backend, **opts), layer

    if layout is None:
        return local(q, k, v, layer, meta)
    heads, pages = layout.heads_spec, layout.layer_specs(layer)
    return jax.shard_map(local, mesh=layout.mesh, in_specs=(heads, heads, heads, pages, P()),
                         out_specs=(heads, pages), check_vma=False)(q, k, v, layer, meta)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, sliding_window: int | None = None,
                     sm_scale: float | None = None) -> jax.Array:
    """Full-sequence causal attention with no cache: q [B, L, H, D], k/v [B, L, K, D].

    Row i sees keys j <= i, and with ``sliding_window`` only j > i - sliding_window."""
    b, length, h, d = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(b, length, kv_heads, h // kv_heads, d).astype(jnp.float32)
    scale = d ** -0.5 if sm_scale is None else sm_scale
    s = jnp.einsum("blkgd,bmkd->bkglm", qg, k.astype(jnp.float32)) * scale
    pos = jnp.arange(length)
    visible = pos[None, :] <= pos[:, None]
    if sliding_window is not None:
        visible &= pos[None, :] > pos[:, None] - sliding_window
    s = jnp.where(visible, s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkglm,bmkd->blkgd", p, v.astype(jnp.float32))
    return o.reshape(b, length, h, d).astype(q.dtype)
