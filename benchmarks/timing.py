"""Timing helpers shared by the benchmark scripts (imported from beside them; no jaxserve import,
so they run on the GPU machine without jaxserve's dependencies)."""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp


def time_fn(fn, *args, iters: int) -> float:
    """Median wall time in seconds of ``fn(*args)`` after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(nbytes: int, iters: int) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read plus written."""
    a = jnp.zeros((nbytes // 4,), jnp.float32)
    return 2 * nbytes / time_fn(jax.jit(lambda v: v + 1.0), a, iters=iters)
