"""Attention backends: one object per ``attention_impl``, owning how K/V are laid out, written and read.

Axis names: T packed tokens, H query heads, K kv heads, D head dim, B sequences.

- ``reference``: the gather-everything oracle the kernels are tested against;
- ``xla``: plain XLA that loops over the live pages only (``pallas_kernels.paged_attention.online``),
  reading K with tokens innermost (``[P, K, D, S]``): the default off GPU. On CPU, float32 pools go to the C++
  kernel of the same contract (``jaxserve.kernels.cpu.attention``) where ``attention.usable`` holds (one device,
  the library loaded, ``JAXSERVE_CPU_ATTENTION`` not 0/off/false/no); the choice is made when the step is traced;
- ``pallas``: the portable Pallas kernels (Triton on GPU, interpret mode on CPU);
- ``mosaic``: the Mosaic GPU (Hopper) decode kernel; prefill and mixed steps run the portable Pallas
  multi-query kernel (Mosaic has none yet);
- ``auto``: ``pallas`` on GPU, ``xla`` elsewhere.

A backend builds the pools it reads (``new_pool``), so a pool carries its layout; ``write`` refuses
a layer of another layout at trace time rather than scattering into the wrong axes.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxserve.cache.kv_pool import KVLayer, KVPool, init_kv_pool, pool_rows
from jaxserve.kernels.cpu import attention as cpu_attention
from pallas_kernels import paged_attention as pa

IMPLS = ("auto", "pallas", "mosaic", "xla", "reference")


@dataclass(frozen=True)
class AttentionBackend:
    """The paged-attention reads of one implementation (a static, hashable value)."""
    name: str
    k_tokens_minor: bool = False

    def storage_dtype(self, dtype) -> jnp.dtype:
        """The dtype this backend's pools hold a model of ``dtype``'s K/V in."""
        return jnp.dtype(dtype)

    def new_pool(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype=jnp.float32) -> KVPool:
        return init_kv_pool(num_layers, num_blocks, block_size, num_kv_heads, head_dim, self.storage_dtype(dtype),
                            k_tokens_minor=self.k_tokens_minor)

    def write(self, layer: KVLayer, k: jax.Array, v: jax.Array, slot_mapping: jax.Array) -> KVLayer:
        if layer.k_tokens_minor != self.k_tokens_minor:
            raise ValueError(f"attention_impl={self.name!r} reads pools with k_tokens_minor={self.k_tokens_minor}, "
                             f"got a pool built with k_tokens_minor={layer.k_tokens_minor}")
        return layer.write(k, v, slot_mapping)

    def write_and_read(self, q: jax.Array, k: jax.Array, v: jax.Array, layer: KVLayer, meta, *,
                       sliding_window: int | None = None,
                       sm_scale: float | None = None) -> tuple[jax.Array, KVLayer] | None:
        """``write`` then ``read`` as one call where this backend has one for ``meta``'s batch, else None (the caller
        writes and reads apart)."""
        return None

    def read(self, q: jax.Array, layer: KVLayer, meta, *, sliding_window: int | None = None,
             sm_scale: float | None = None) -> jax.Array:
        """q [T, H, D] against the pool through ``meta``'s block tables -> [T, H, D]."""
        args = (q, layer.k, layer.v, meta.block_tables, meta.context_lens)
        kw = dict(sliding_window=sliding_window, sm_scale=sm_scale)
        if meta.decode_only:
            return self.decode(*args, **kw)
        if meta.uniform_q_len is not None and self.reads_uniform:
            return self.uniform(*args, meta.uniform_q_len, **kw)
        return self.ragged(*args, meta.cu_q_lens, max_chunks=meta.max_chunks, **kw)

    # The reads. ``uniform``: every sequence has the same q_len (speculative verify, fresh prompts);
    # a backend without one (``reads_uniform = False``) serves those batches with ``ragged``.
    reads_uniform = True

    def decode(self, q, k_pages, v_pages, tables, lens, **kw):
        return pa.paged_attention_reference(q, k_pages, v_pages, tables, lens, **kw)

    def uniform(self, q, k_pages, v_pages, tables, lens, q_len: int, **kw):
        return pa.uniform_paged_attention_reference(q, k_pages, v_pages, tables, lens, q_len, **kw)

    def ragged(self, q, k_pages, v_pages, tables, lens, cu_q_lens, *, max_chunks=None, **kw):
        return pa.ragged_paged_attention_reference(q, k_pages, v_pages, tables, lens, cu_q_lens, **kw)


@dataclass(frozen=True)
class XlaAttention(AttentionBackend):
    k_tokens_minor: bool = True

    def storage_dtype(self, dtype) -> jnp.dtype:
        """On XLA:CPU a bf16 model's pool holds its bf16 bits as ``uint16`` where the C++ attention kernel reads it
        (``cpu_attention.available()``): XLA:CPU has no bf16 scatter or gather (a bf16 pool, or a bit-cast of one,
        would be copied whole around each write), while uint16 rows scatter in place and the kernel widens each
        element as it reads it, so attention sees the values a float32 pool would hold, at half the bytes.
        Other 16-bit pools on CPU are float32: XLA would widen each layer's whole pool to float32 (and narrow it
        back) around every write and page read (SmolLM2-135M in bf16 at batch 1: ~72 of ~125 ms of device time).
        K/V rows arrive rounded to the model's dtype and float32 holds them exactly: the same values, twice the
        memory."""
        dtype = jnp.dtype(dtype)
        if jax.default_backend() != "cpu" or dtype.itemsize >= 4:
            return dtype
        return jnp.dtype(jnp.uint16) if dtype == jnp.bfloat16 and cpu_attention.available() else jnp.dtype(jnp.float32)

    def write_and_read(self, q, k, v, layer, meta, *, sliding_window=None, sm_scale=None):
        """Where the C++ kernel reads the pools and no sequence has more than ``ROWS_PER_ITEM`` new rows (decode
        steps, verify rounds), its writing variant stores the rows in place as it reads their pages
        (``paged_attention_write_cpu``): the same pools and output as ``write`` then ``read``."""
        rows = 1 if meta.decode_only else meta.uniform_q_len
        if (meta.fresh or rows is None or rows > cpu_attention.ROWS_PER_ITEM or not layer.k_tokens_minor
                or layer.k.dtype not in cpu_attention.WRITE_TARGETS or not cpu_attention.usable(layer.k, layer.v)):
            return None
        cu_q_lens = jnp.arange(meta.block_tables.shape[0] + 1, dtype=jnp.int32) * rows  # (as decode / uniform read)
        out, kt, vp = cpu_attention.paged_attention_write_cpu(
            q, pool_rows(k, layer.k.dtype), pool_rows(v, layer.v.dtype), meta.slot_mapping, layer.k, layer.v,
            meta.block_tables, meta.context_lens, cu_q_lens, sliding_window=sliding_window, sm_scale=sm_scale)
        return out, layer.replace(k=kt, v=vp)

    @staticmethod
    def _as_float(k_pages, v_pages):
        """Pools of bf16 bits as bf16 for the XLA loop (the kernel switched off after the pool was built)."""
        if k_pages.dtype == jnp.uint16:
            return tuple(jax.lax.bitcast_convert_type(x, jnp.bfloat16) for x in (k_pages, v_pages))
        return k_pages, v_pages

    def decode(self, q, k_pages, v_pages, tables, lens, **kw):
        if cpu_attention.usable(k_pages, v_pages):
            return cpu_attention.paged_attention_cpu(q, k_pages, v_pages, tables, lens, **kw)
        return pa.paged_attention_online(q, *self._as_float(k_pages, v_pages), tables, lens, **kw)

    def uniform(self, q, k_pages, v_pages, tables, lens, q_len: int, **kw):
        if cpu_attention.usable(k_pages, v_pages):
            return cpu_attention.uniform_paged_attention_cpu(q, k_pages, v_pages, tables, lens, q_len, **kw)
        return pa.uniform_paged_attention_online(q, *self._as_float(k_pages, v_pages), tables, lens, q_len, **kw)

    def ragged(self, q, k_pages, v_pages, tables, lens, cu_q_lens, *, max_chunks=None, **kw):
        if cpu_attention.usable(k_pages, v_pages):
            return cpu_attention.ragged_paged_attention_cpu(q, k_pages, v_pages, tables, lens, cu_q_lens, **kw)
        return pa.ragged_paged_attention_online(q, *self._as_float(k_pages, v_pages), tables, lens, cu_q_lens,
                                                max_chunks=max_chunks, **kw)


@dataclass(frozen=True)
class PallasAttention(AttentionBackend):
    reads_uniform = False  # the ragged kernel serves uniform batches

    def decode(self, q, k_pages, v_pages, tables, lens, **kw):
        return pa.paged_attention(q, k_pages, v_pages, tables, lens, **kw)

    def ragged(self, q, k_pages, v_pages, tables, lens, cu_q_lens, *, max_chunks=None, **kw):
        return pa.ragged_paged_attention(q, k_pages, v_pages, tables, lens, cu_q_lens, **kw)


@dataclass(frozen=True)
class MosaicAttention(PallasAttention):
    def decode(self, q, k_pages, v_pages, tables, lens, *, sliding_window=None, sm_scale=None):
        if sliding_window is not None or sm_scale is not None:
            raise ValueError("attention_impl='mosaic' has no sliding window or custom sm_scale yet; "
                             f"got sliding_window={sliding_window}, sm_scale={sm_scale}")
        return pa.paged_attention_mosaic(q, k_pages, v_pages, tables, lens)


def resolve_impl(impl: str) -> str:
    """``impl`` with "auto" resolved for the default backend; a ``ValueError`` names an unknown one."""
    if impl == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "xla"
    if impl not in IMPLS:
        raise ValueError(f"attention_impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}")
    return impl


@functools.cache
def _backend(name: str) -> AttentionBackend:
    cls = {"reference": AttentionBackend, "xla": XlaAttention, "pallas": PallasAttention,
           "mosaic": MosaicAttention}[name]
    return cls(name)


def attention_backend(impl: str) -> AttentionBackend:
    return _backend(resolve_impl(impl))


def new_kv_pool(config, num_blocks: int, block_size: int, attention_impl: str = "auto") -> KVPool:
    """A zeroed pool for ``config`` (a ``ModelConfig``) in the layout ``attention_impl`` reads."""
    return attention_backend(attention_impl).new_pool(config.num_layers, num_blocks, block_size,
                                                      config.num_kv_heads, config.head_dim, jnp.dtype(config.dtype))
