"""The ragged expert dispatch where XLA has ``ragged_all_to_all`` (gpu-marked: benchmarks/gpu_check.sh runs it on a
lent GPU; the CPU tests only lower it, or run it emulated: tests/parallel/mesh_check.py). With one GPU the mesh has
one device and the expert axis size 1, which still runs the ragged_all_to_all path ("auto" resolves to it there)."""
import jax
import pytest

from tests.parallel.tiny import GREEDY, make, tokens


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_ragged_dispatch_serves_the_single_device_tokens(name):
    t = 2 if len(jax.devices()) >= 2 else 1
    ep = make(name, t, ep=True)  # moe_dispatch="auto"
    assert ep.engine.runner.layout.moe_dispatch == "ragged", ep.engine.runner.layout
    assert tokens(ep, GREEDY) == tokens(make(name), GREEDY)
