"""Shared test configuration: GPU-marked tests run only on a GPU backend; peers-marked tests only
with the peers extra (torch, transformers) installed. XLA:CPU compiles the tests' programs without its backend
optimizations (below)."""
import atexit
import gc
import importlib.util
import os
import shutil
import tempfile

# tests/xla_flags.py: LLVM optimizations off (compiling is most of the suite's time); subprocesses inherit it
from tests.xla_flags import TEST_JAXLIB, TEST_XLA_FLAGS

# Not jaxserve's cache under ~/.cache (subprocesses inherit this; setdefault: a run may opt in). On jaxlib 0.10 no
# persistent compilation cache at all: writing an entry (`executable.serialize()`) has segfaulted an xdist worker at
# random (CI of stops 34, 35 and a fresh-clone run on 2026-12-02, in jax/_src/compilation_cache.py
# put_executable_and_time).
os.environ.setdefault("JAXSERVE_COMPILATION_CACHE", "0")
# On jaxlib >= 0.11 (no such segfault seen) the run's processes share a temporary one: a program compiled by one xdist worker, by
# a subprocess, or before jax.clear_caches() (jaxserve/memory_maps.py) is read, not compiled again (tests/engine and
# tests/speculative on jaxlib 0.12: 234 s -> 190 s). The first process to load this file (pytest's controller, which
# starts the workers and so passes them the variable) makes the directory and removes it when it exits.
if TEST_JAXLIB >= (0, 11) and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="jaxserve-tests-xla-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import jax
import pytest

from jaxserve.memory_maps import release_programs

# Compiled XLA:CPU kernels hold memory mappings of their own (jaxserve/memory_maps.py): an xdist worker running half
# the suite would pass vm.max_map_count and die at random. Counting costs ~1 ms per 1,000 mappings, so every 4th
# test; one test adds at most a few thousand.
CHECK_EVERY = 4
_tests_run = [0]


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
    """After every CHECK_EVERY-th test, JAX's caches are cleared if the process holds over MAX_MEMORY_MAPS mappings."""
    yield
    _tests_run[0] += 1
    if _tests_run[0] % CHECK_EVERY == 0:
        release_programs()


HAVE_PEERS = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Skips what this machine cannot run; under ``--dist loadgroup`` a test without a group of its own joins its
    file's, so a module's fixtures and compiled programs are built on one worker, not on both."""
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if not HAVE_PEERS:
        skip_peers = pytest.mark.skip(reason="needs the peers extra (torch, transformers)")
        for item in items:
            if "peers" in item.keywords:
                item.add_marker(skip_peers)
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU (run by benchmarks/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _collect_less_often():
    """CPython's cyclic collector ran ~5% of a worker's CPU (the suite under ``perf``): each full collection walks
    every object JAX keeps (jaxprs, lowering caches, modules), and with the default gen-0 threshold (700
    allocations) tracing and lowering trigger thousands. The objects alive after collection (modules, fixtures' code)
    move to the permanent generation, and a collection waits for more allocations; cycles are still freed.
    ``JAXSERVE_TEST_GC=default`` keeps CPython's settings."""
    if os.environ.get("JAXSERVE_TEST_GC") != "default":
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)


def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` each worker's grouped tests carry their group in their node id (how pytest-xdist
    sends a group to one worker). Where that is lost (pytest 9.2 with pytest-xdist 3.8: pytest-xdist issue 1386),
    the groups' shared fixtures are built on every worker, silently; fail instead. First, the collector's
    settings (``_collect_less_often``)."""
    _collect_less_often()
    config = session.config
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):  # a worker's view
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]]
    if lost:
        raise pytest.UsageError(f"--dist loadgroup is not grouping on pytest {pytest.__version__} (pytest-xdist issue "
                                f"1386): {len(lost)} grouped tests without their group in the node id, e.g. {lost[0]}")
