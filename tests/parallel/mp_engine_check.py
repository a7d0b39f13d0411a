"""Two real processes (gloo on 127.0.0.1, one CPU device each) serve one model split over both: a Qwen3-MoE with
its attention tensor-parallel (heads and the KV pool split, an all-reduce over gloo) and its experts split over
both processes (expert parallelism, all_to_all over gloo). Every process runs the same host scheduler over the
same requests (multi-controller SPMD) and prints the greedy and seeded outputs; process 0 then checks them
against the one-device engine's (the test checks that both processes printed the same).

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
    split = make("qwen3_moe", t=num_processes, ep=True)
    pool = split.engine.runner.pool.layers[0].v
    assert not pool.is_fully_addressable and len(pool.addressable_shards) == 1
    got = [tokens(split, GREEDY), tokens(split, SEEDED)]
    print(f"process {process_id} outputs: {got}", flush=True)
    if process_id == 0:  # the one-device reference once, not per process (the other waits in shutdown's barrier)
        with jax.default_device(jax.local_devices()[0]):
            want = [tokens(one := make("qwen3_moe"), GREEDY), tokens(one, SEEDED)]
        assert got == want, (got, want)
        print(f"process 0: tensor- and expert-parallel over {num_processes} processes equal one device", flush=True)
    distributed.shutdown()


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
