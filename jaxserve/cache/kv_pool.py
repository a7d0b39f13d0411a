"""The paged KV pool: the device side of PagedAttention.

Axis names: P pages (blocks), S page size, K kv heads, D head dim, T new tokens.

A pool is a list with one ``(k_pages, v_pages)`` pair per layer, each ``[P, S, K, D]``, except
that the plain-XLA attention (``attention_impl="xla"``, the default off GPU) reads K with tokens
innermost, ``[P, K, D, S]`` (``k_tokens_minor=True``; why: ``pallas_kernels/paged_attention/online.py``).
The layout is fixed when the pool is built and passed again to ``write_kv``; pages stay axis 0 in
both, so block copies and all host bookkeeping ignore it. Separate per-layer buffers (not one
stacked array) let a jitted step donate and update each layer in place; a stacked ``lax.scan``
layout copies the cache every step (DESIGN.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

KVPool = list[tuple[jax.Array, jax.Array]]


def init_kv_pool(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype=jnp.float32, *, k_tokens_minor: bool = False) -> KVPool:
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_shape = (num_blocks, num_kv_heads, head_dim, block_size) if k_tokens_minor else shape
    return [(jnp.zeros(k_shape, dtype), jnp.zeros(shape, dtype)) for _ in range(num_layers)]


def kv_pool_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                            dtype=jnp.float32) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * jnp.dtype(dtype).itemsize


def page_size(pool: KVPool) -> int:
    """Tokens per page, read from V ([P, S, K, D] in every layout; K's axis 1 is S only when not tokens-minor)."""
    return pool[0][1].shape[1]


def write_kv(k_pages: jax.Array, v_pages: jax.Array, k: jax.Array, v: jax.Array,
             slot_mapping: jax.Array, *, k_tokens_minor: bool = False) -> tuple[jax.Array, jax.Array]:
    """Scatters new K/V rows ``[T, K, D]`` to flat slots ``i32[T]`` (page * S + offset).

    Negative slots mark padding tokens and are dropped. ``k_tokens_minor``: the pool's K is
    ``[P, K, D, S]`` (as built by ``init_kv_pool``).
    """
    num_pages, page_size = v_pages.shape[:2]
    slots = jnp.where(slot_mapping < 0, num_pages * page_size, slot_mapping)
    page, offset = slots // page_size, slots % page_size  # padding: page index out of range => dropped

    # Indexed by (page, offset), not through a [P*S, K, D] reshape: with one KV head that reshape
    # let XLA:CPU give the scattered pool a permuted layout and copy every layer's whole pool back
    # (in the engine's speculative round, ~4 ms of copies per round for the 1-head draft).
    v_pages = v_pages.at[page, offset].set(v.astype(v_pages.dtype), mode="drop")
    if k_tokens_minor:
        return k_pages.at[page, :, :, offset].set(k.astype(k_pages.dtype), mode="drop"), v_pages
    return k_pages.at[page, offset].set(k.astype(k_pages.dtype), mode="drop"), v_pages


def copy_blocks(pool: KVPool, src: jax.Array, dst: jax.Array) -> KVPool:
    """Copy-on-write: copies pages ``src i32[N]`` onto ``dst i32[N]`` in every layer.

    Pairs with dst < 0 are padding and are skipped.
    """
    def copy(pages):
        num_pages = pages.shape[0]
        safe_dst = jnp.where(dst < 0, num_pages, dst)
        return pages.at[safe_dst].set(pages[jnp.clip(src, 0, num_pages - 1)], mode="drop")

    return [(copy(k), copy(v)) for k, v in pool]
