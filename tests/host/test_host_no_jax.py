"""Host bookkeeping imports no JAX (DESIGN.md), checked where it matters: in a fresh interpreter,
``sys.modules`` after importing each host module holds no jax, jaxlib, flax, orbax or optax. This
covers what the module imports through package faces (``jaxserve/lazy.py``), not only its own lines."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

DEVICE_PACKAGES = ("jax", "jaxlib", "flax", "orbax", "optax")
HOST_MODULES = [
    "jaxserve",  # the face alone: LLM and friends load on first use
    "jaxserve.cache.block_manager", "jaxserve.cache.prefix_cache", "jaxserve.cache.reservation",
    "jaxserve.engine.sequence", "jaxserve.engine.scheduler",
    "jaxserve.engine.outputs", "jaxserve.engine.streaming",
    "jaxserve.sampling_params", "jaxserve.config", "jaxserve.validation", "jaxserve.speculative.config",
    "jaxserve.speculative.suffix_tree",
    "jaxserve.tokenizer", "jaxserve.tokenizer_gguf", "jaxserve.chat_template",
    "jaxserve.zoo", "jaxserve.cli",  # `jaxserve --help` answers without loading JAX
    "jaxserve.engine.beam_search", "jaxserve.engine.batching", "jaxserve.engine.spec_policy",
    "jaxserve.bench.peers", "jaxserve.bench.workload",  # the peer harness and workload files: host only
]
ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout under test, first on the path
PROBE = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
         "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")


def loaded_top_level(module: str) -> set[str]:
    """Top-level package names in sys.modules of a fresh interpreter after ``import module``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("module", HOST_MODULES)
def test_host_module_loads_no_jax(module):
    loaded = loaded_top_level(module)
    assert "jaxserve" in loaded
    assert not loaded & set(DEVICE_PACKAGES), f"{module} loads {sorted(loaded & set(DEVICE_PACKAGES))}"


def test_the_probe_sees_jax_where_it_is_loaded():
    assert {"jax", "flax"} <= loaded_top_level("jaxserve.engine.runner")


def test_public_names_load_on_first_use():
    import jaxserve
    from jaxserve import LLM, BeamSearchParams, SamplingParams, SpeculativeConfig
    from jaxserve.engine.llm import LLM as engine_llm
    assert LLM is engine_llm and jaxserve.LLM is LLM
    assert SamplingParams(max_tokens=3).max_tokens == 3 and BeamSearchParams(beam_width=2).beam_width == 2
    assert SpeculativeConfig.__module__ == "jaxserve.speculative.config"
    assert set(jaxserve.__all__) <= set(dir(jaxserve))
    with pytest.raises(AttributeError, match="'jaxserve' has no attribute 'NoSuchName'"):
        jaxserve.NoSuchName


def test_the_kernel_benchmarks_timing_needs_none_of_jaxserves_other_dependencies():
    """The GPU check runs benchmarks/paged_attention.py and fp4_matmul.py where omegaconf may be missing."""
    loaded = loaded_top_level("jaxserve.bench.timing")
    assert "jax" in loaded and not loaded & {"omegaconf", "tokenizers", "jinja2", "flax", "orbax"}
