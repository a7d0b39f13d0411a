"""Measurements for validating the roofline: this device's ceilings and jaxserve's decode step.

``device_ceilings`` times JAX microbenchmarks (an in-place update, a sum, a square matmul); ``time_decode_step``
times ``ModelRunner.execute`` on a hand-built all-decode batch: every sequence holds ``context``
tokens (the new one included) in its own blocks, so the step is exactly what the engine runs in
steady-state decoding at that batch, host packing and the result transfer included.
"""
from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp

from jaxserve.bench.timing import time_fn
from jaxserve.engine.runner import ModelRunner
from jaxserve.engine.scheduler import ScheduledSequence, SchedulerOutput
from jaxserve.sampling_params import SamplingParams


def device_ceilings(nbytes: int, matmul_n: int, dtype: str, iters: int) -> dict:
    """Measured read bandwidth (a sum), in-place update bandwidth (bytes read + written per s), and
    the FLOP/s of an n x n x n matmul in ``dtype``, on JAX's default device.

    The update donates its input: a decode step updates its donated KV pool in place, and on CPU a
    fresh output buffer per call (jaxserve.bench.timing.copy_bandwidth) measures page faults instead
    (2.3 vs 7.9 GB/s at 256 MiB on this machine, load 11)."""
    x = jnp.ones((nbytes // 4,), jnp.float32)
    read_s = time_fn(jax.jit(jnp.sum), x, iters=iters)
    update_s = _time_donated(jax.jit(lambda v: v + 1.0, donate_argnums=0), x, iters)
    a = jax.random.normal(jax.random.key(0), (matmul_n, matmul_n), dtype)
    b = jax.random.normal(jax.random.key(1), (matmul_n, matmul_n), dtype)
    matmul_s = time_fn(jax.jit(jnp.matmul), a, b, iters=iters)
    device = jax.devices()[0]
    return {"device": f"{device.platform}: {device.device_kind}", "update_bw": 2 * nbytes / update_s,
            "read_bw": nbytes / read_s, "matmul_flops": 2 * matmul_n ** 3 / matmul_s, "matmul_dtype": dtype,
            "memory_bytes": _memory_bytes(device), "nbytes": nbytes, "matmul_n": matmul_n, "iters": iters}


def _time_donated(fn, x, iters: int) -> float:
    """Median seconds of ``x = fn(x)`` (the input donated each time), after one warm-up call."""
    x = jax.block_until_ready(fn(x))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        x = jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _memory_bytes(device) -> float:
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"])
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def time_decode_step(config, params, batch: int, context: int, iters: int, block_size: int = 16,
                     attention_impl: str = "auto") -> float:
    """Median seconds of one decode step of ``batch`` sequences of ``context`` tokens.

    ``context`` should be a power-of-two multiple of ``block_size`` so that the block tables need
    no padding (the runner pads them to power-of-two page buckets) and every key read is live.
    """
    pages = -(-context // block_size)
    runner = ModelRunner(config, params, num_blocks=batch * pages + 1, block_size=block_size, max_num_seqs=batch,
                         max_num_batched_tokens=batch, max_model_len=pages * block_size,
                         attention_impl=attention_impl)
    entries = []
    for i in range(batch):
        table = list(range(1 + i * pages, 1 + (i + 1) * pages))  # block 0 stays free, as in the engine
        pos = context - 1
        entries.append(ScheduledSequence(seq_id=i, request_id=str(i), index=0, token_ids=[1 + i], start_pos=pos,
                                         block_table=table, slot_mapping=[table[pos // block_size] * block_size
                                                                          + pos % block_size],
                                         sample=True, num_samples=1, sampling_params=SamplingParams(temperature=0)))
    scheduled = SchedulerOutput(scheduled=entries, copies=[], preempted=[], num_batched_tokens=batch)
    seconds = time_fn(runner.execute, scheduled, iters=iters)
    if runner.num_compilations > 1:  # a second program would mean the timed step is not the one meant
        raise RuntimeError(f"decode step at batch {batch} compiled {runner.num_compilations} programs, expected 1")
    return seconds
