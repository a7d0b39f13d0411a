"""Multi-process start-up: one JAX runtime over several processes (hosts), CPU included.

Every process calls ``initialize`` with the same coordinator address and process count; after it
``jax.devices()`` lists the devices of all processes and a mesh over them runs ``shard_map``
collectives across processes. On CPU the collectives go through gloo (set here), so two processes
on 127.0.0.1 behave like two hosts.
"""
from __future__ import annotations

import socket

import jax


def initialize(coordinator_address: str, num_processes: int, process_id: int,
               cpu_collectives: str = "gloo", **kwargs) -> None:
    """Joins this process to the job; call before any other JAX work (it fixes the backend).

    coordinator_address: "host:port" of process 0; kwargs go to ``jax.distributed.initialize``.
    """
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id={process_id} must be in [0, num_processes={num_processes})")
    if ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)


def shutdown() -> None:
    jax.distributed.shutdown()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for a local coordinator in tests and examples)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
