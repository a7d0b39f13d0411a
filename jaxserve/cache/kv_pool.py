"""The paged KV pool: the device side of PagedAttention, as a typed pytree that knows its layout.

Axis names: P pages (blocks), S page size, K kv heads, D head dim, T new tokens.

A ``KVPool`` holds one ``KVLayer`` per decoder layer: ``v`` is ``[P, S, K, D]``; ``k`` is the same,
or ``[P, K, D, S]`` (tokens innermost) when the layer's static ``k_tokens_minor`` says so — the
layout the plain-XLA attention reads fastest (why: ``pallas_kernels/paged_attention/online.py``).
The layout is fixed when the pool is built (by the attention backend that will read it:
``jaxserve.models.attention_backends``) and travels with the pool, so nothing re-derives it.
Pages stay axis 0 in both layouts, so block copies and all host bookkeeping ignore it. A ``uint16`` pool holds bf16
bits (a bf16 model's pool on CPU where the C++ attention kernel reads it: ``attention_backends.XlaAttention``).
Separate per-layer buffers (not one stacked array) let a jitted step donate and update each
layer in place; a stacked ``lax.scan`` layout copies the cache every step (docs/architecture.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVLayer:
    k: jax.Array  # [P, S, K, D], or [P, K, D, S] with k_tokens_minor
    v: jax.Array  # [P, S, K, D]
    k_tokens_minor: bool = struct.field(pytree_node=False, default=False)

    @property
    def num_pages(self) -> int:
        return self.v.shape[0]

    @property
    def page_size(self) -> int:
        return self.v.shape[1]

    def write(self, k: jax.Array, v: jax.Array, slot_mapping: jax.Array) -> KVLayer:
        """Scatters new K/V rows ``[T, K, D]`` to flat slots ``i32[T]`` (page * S + offset).

        Negative slots mark padding tokens and are dropped.
        """
        num_pages, page_size = self.num_pages, self.page_size
        if k.shape[0] == 1:  # one row, written twice to its slot (the same bits): XLA would turn a one-row scatter
            # into a dynamic update slice, whose fused computation of the row (RoPE, the bf16 rounding) rounded k
            # differently from the scatter of more rows, so a bf16 request decoded alone drifted from itself in a
            # batch (one bit of layer 23's k at SmolLM2's 94th position, then its log-probs). (A second row with a
            # constant slot of -1 was simplified away again.)
            k, v, slot_mapping = (jnp.concatenate([a, a]) for a in (k, v, slot_mapping))
        slots = jnp.where(slot_mapping < 0, num_pages * page_size, slot_mapping)
        page, offset = slots // page_size, slots % page_size  # padding: page index out of range => dropped
        # Indexed by (page, offset), not through a [P*S, K, D] reshape: with one KV head that reshape
        # let XLA:CPU give the scattered pool a permuted layout and copy every layer's whole pool back
        # (in the engine's speculative round, ~4 ms of copies per round for the 1-head draft).
        new_v = self.v.at[page, offset].set(pool_rows(v, self.v.dtype), mode="drop")
        if self.k_tokens_minor:
            new_k = self.k.at[page, :, :, offset].set(pool_rows(k, self.k.dtype), mode="drop")
        else:
            new_k = self.k.at[page, offset].set(pool_rows(k, self.k.dtype), mode="drop")
        return self.replace(k=new_k, v=new_v)


def pool_rows(rows: jax.Array, pool_dtype) -> jax.Array:
    """New K/V rows -> the pool's elements: a ``uint16`` pool holds bf16 bits (rows rounded to bf16, then bit-cast:
    XLA:CPU has no bf16 scatter, and bit-casting a bf16 pool instead would copy all of it)."""
    if pool_dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(rows.astype(jnp.bfloat16), jnp.uint16)
    return rows.astype(pool_dtype)


@struct.dataclass
class KVPool:
    layers: tuple[KVLayer, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_pages(self) -> int:
        return self.layers[0].num_pages

    @property
    def page_size(self) -> int:
        return self.layers[0].page_size

    @property
    def k_tokens_minor(self) -> bool:
        return self.layers[0].k_tokens_minor

    def copy_blocks(self, src: jax.Array, dst: jax.Array) -> KVPool:
        """Copy-on-write: copies pages ``src i32[N]`` onto ``dst i32[N]`` in every layer.

        Pairs with dst < 0 are padding and are skipped.
        """
        def copy(pages):
            num_pages = pages.shape[0]
            safe_dst = jnp.where(dst < 0, num_pages, dst)
            return pages.at[safe_dst].set(pages[jnp.clip(src, 0, num_pages - 1)], mode="drop")

        return self.replace(layers=tuple(layer.replace(k=copy(layer.k), v=copy(layer.v)) for layer in self.layers))


def init_kv_pool(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype=jnp.float32, *, k_tokens_minor: bool = False) -> KVPool:
    """A zeroed pool. Prefer ``jaxserve.models.attention_backends.new_kv_pool``, which takes the
    layout from the attention implementation that will read the pool."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_shape = (num_blocks, num_kv_heads, head_dim, block_size) if k_tokens_minor else shape
    return KVPool(tuple(KVLayer(jnp.zeros(k_shape, dtype), jnp.zeros(shape, dtype), k_tokens_minor)
                        for _ in range(num_layers)))


def kv_pool_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                            dtype=jnp.float32) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * jnp.dtype(dtype).itemsize
