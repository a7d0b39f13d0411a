"""A persistent compilation cache for the engine's step programs (JAX's own, on disk).

A real model's step program takes XLA a long time to compile (SmolLM2-135M, 30 unrolled layers: ~15-50 s a
program on a 2-core CPU), and a workload compiles a handful of bucketed programs. Like vLLM, which keeps its
compiled graphs under ``~/.cache/vllm``, jaxserve keeps JAX's compilation cache under
``$JAXSERVE_CACHE_DIR/xla`` (default ``~/.cache/jaxserve/xla``), so the same model and shapes compile once
per machine, not once per process. ``JAXSERVE_COMPILATION_CACHE=0`` turns it off; a cache directory the
user configured in JAX (``jax_compilation_cache_dir``) is left as it is.
"""
from __future__ import annotations

import os
import pathlib


def default_cache_dir() -> pathlib.Path:
    root = os.environ.get("JAXSERVE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "jaxserve")
    return pathlib.Path(root) / "xla"


def enable_compilation_cache() -> pathlib.Path | None:
    """Points JAX's persistent compilation cache at jaxserve's directory unless it is off or already set;
    returns the directory in use (None: off)."""
    import jax

    if os.environ.get("JAXSERVE_COMPILATION_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return pathlib.Path(current)
    directory = default_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: compile every time rather than fail
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    return directory
