"""Two real processes (gloo on 127.0.0.1) run expert parallelism and equal one process.

Usage: python tests/moe/mp_check.py PROCESS_ID NUM_PROCESSES PORT. Each process has 2 simulated
CPU devices; the mesh {"data": 2, "expert": 2} spans both processes. Run by test_expert_parallel.py.
"""
import os
import sys

from tests.xla_flags import with_devices

os.environ["XLA_FLAGS"] = with_devices(2)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxserve.config import ModelConfig  # noqa: E402
from jaxserve.parallel import distributed, make_mesh  # noqa: E402

CONFIG = ModelConfig(hidden_size=16, intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                     num_shared_experts=1, shared_expert_intermediate_size=20, shared_expert_gate=True,
                     router="qwen3_moe")  # Qwen2-MoE-style gated shared expert


def main(process_id: int, num_processes: int, port: int):
    distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
    from jaxserve.moe import MoEBlock
    from jaxserve.moe.parallel import expert_parallel_moe
    assert jax.process_count() == num_processes and len(jax.devices()) == 2 * num_processes
    x = np.asarray(jax.random.normal(jax.random.key(1), (16, 16)))  # same on every process
    block = MoEBlock(CONFIG)
    local = jax.local_devices()[0]
    with jax.default_device(local):
        weights = jax.tree_util.tree_map(np.asarray, block.init(jax.random.key(0), x)["params"])
        ref, stats = block.apply({"params": weights}, x)
    mesh = make_mesh({"data": 2, "expert": 2})
    y, ep = expert_parallel_moe(weights, CONFIG, x, mesh)
    for shard in y.addressable_shards:
        np.testing.assert_allclose(np.asarray(shard.data), np.asarray(ref)[shard.index], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(ep.load.addressable_data(0)), np.asarray(stats.load))
    print(f"process {process_id}: {len(y.addressable_shards)} shards equal the single-process block")
    distributed.shutdown()


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
