"""Load-time guards of the engine: params that are finite, a KV pool that fits in memory."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np


def check_params_finite(params, what: str = "model") -> None:
    """``ValueError`` naming the first floating-point leaf that holds a NaN or inf."""
    leaves = [(path, x) for path, x in jax.tree_util.tree_leaves_with_path(params)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    flags = jax.device_get([jnp.all(jnp.isfinite(x)) for _, x in leaves])
    for (path, x), good in zip(leaves, flags):
        if not good:
            count = int(jnp.size(x) - jnp.count_nonzero(jnp.isfinite(x)))
            raise ValueError(f"{what} params {jax.tree_util.keystr(path)} hold {count} NaN/inf value(s): "
                             "refusing to serve a model with non-finite weights")


def available_bytes() -> tuple[int, str] | None:
    """(bytes free for new arrays, where that figure comes from), or None if unknown.

    A GPU/TPU: the sum over local devices of ``bytes_limit - bytes_in_use`` from ``memory_stats()``;
    the CPU: ``MemAvailable`` of /proc/meminfo (else physical pages x page size)."""
    devices = jax.local_devices()
    if devices[0].platform != "cpu":
        try:
            stats = [d.memory_stats() for d in devices]
            return sum(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats), \
                f"free memory of {len(devices)} {devices[0].platform} device(s)"
        except (TypeError, KeyError, AttributeError, RuntimeError):  # no stats from this backend
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory"
    except (ValueError, OSError, AttributeError):
        return None


def check_kv_fits(num_blocks: int, block_bytes: int, field: str = "num_kv_blocks") -> None:
    """``ValueError`` before allocating a KV pool of ``num_blocks`` blocks that memory cannot hold."""
    need = num_blocks * block_bytes
    avail = available_bytes()
    if avail is not None and need > avail[0]:
        raise ValueError(f"{field}: a KV pool of {num_blocks} blocks x {block_bytes} bytes = {need:,} bytes "
                         f"does not fit in the {avail[0]:,} bytes available ({avail[1]}); lower num_kv_blocks "
                         "or kv_cache_bytes")
