"""Params live on the device: a jitted step copies every numpy argument to the device on every call
(for tiny-code's 26 MB, ~6 ms a step, more than a batch-1 decode step itself)."""
import jax
import numpy as np

from jaxserve import LLM
from jaxserve.models.loading import resolve_model


def _on_device(tree) -> bool:
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.Array) for x in leaves)


def test_zoo_params_load_as_device_arrays():
    config, params, _ = resolve_model("jaxserve/tiny-code-draft")
    assert _on_device(params)


def test_runner_moves_numpy_params_to_the_device():
    config, params, _ = resolve_model("jaxserve/tiny-code-draft")
    host = jax.tree.map(np.asarray, params)
    assert not _on_device(host)
    engine = dict(block_size=8, max_num_seqs=2, max_num_batched_tokens=32, num_kv_blocks=8)
    assert _on_device(LLM.from_params(config, host, **engine).engine.runner.params)  # (packed where the kernels load)
    llm = LLM.from_params(config, host, weight_layout="as_stored", **engine)
    assert _on_device(llm.engine.runner.params)
    for got, want in zip(jax.tree.leaves(llm.engine.runner.params), jax.tree.leaves(host)):
        np.testing.assert_array_equal(got, want)  # moved, not changed
