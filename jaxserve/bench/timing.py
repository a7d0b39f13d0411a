"""Timing helpers shared by the benchmark scripts and the experiments. Importing this module loads
JAX and NumPy only (the package faces are lazy), so the kernel benchmarks run on the GPU machine
without jaxserve's other dependencies (omegaconf, tokenizers, ...)."""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


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


def time_alternating(fns: dict, reps: int, per: int = 1) -> dict:
    """name -> {"min_ms", "p25_ms"} of ``reps`` rounds that call every fn once, in turn, after one warm-up
    (compile) call each, so drift in the machine's speed hits all alike; times divided by ``per``
    (e.g. the iterations of a ``fori_loop`` inside each call)."""
    for f in fns.values():
        jax.block_until_ready(f())
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append((time.perf_counter() - t0) / per * 1e3)
    return {k: {"min_ms": min(v), "p25_ms": float(np.percentile(v, 25))} for k, v in times.items()}
