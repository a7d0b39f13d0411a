"""Two real processes (gloo on 127.0.0.1, one CPU device each) serve one model split over both with
tensor parallelism: every process runs the same host scheduler over the same requests (multi-controller
SPMD) and gets the outputs of the one-device engine; the same for a Qwen3-MoE with its experts split
over both processes (expert parallelism, data-parallel attention).

Usage: python tests/parallel/mp_engine_check.py PROCESS_ID NUM_PROCESSES PORT (run by test_mesh.py).
"""
import os
import sys

from tests.xla_flags import with_devices

os.environ["XLA_FLAGS"] = with_devices(1)

import jax  # noqa: E402

from jaxserve.parallel import distributed  # noqa: E402


def main(process_id: int, num_processes: int, port: int):
    distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
    from tests.parallel.tiny import GREEDY, SEEDED, make, tokens
    assert jax.process_count() == num_processes and len(jax.local_devices()) == 1
    with jax.default_device(jax.local_devices()[0]):
        want = [tokens(llm := make("llama"), GREEDY), tokens(llm, SEEDED)]
    split = make("llama", t=num_processes)
    pool = split.engine.runner.pool.layers[0].v
    assert not pool.is_fully_addressable and len(pool.addressable_shards) == 1
    got = [tokens(split, GREEDY), tokens(split, SEEDED)]
    assert got == want, (got, want)
    with jax.default_device(jax.local_devices()[0]):
        want = tokens(make("qwen3_moe"), GREEDY)
    assert tokens(make("qwen3_moe", ep=True, d=num_processes), GREEDY) == want
    print(f"process {process_id}: tensor- and expert-parallel over {num_processes} processes equal one device",
          flush=True)
    distributed.shutdown()


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
