"""Expert parallelism on 8 simulated CPU devices equals the single-device MoE block.

Run by test_expert_parallel.py in a subprocess (XLA_FLAGS must be set before jax is imported).
"""
import os

from tests.xla_flags import with_devices

os.environ["XLA_FLAGS"] = with_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxserve.config import ModelConfig  # noqa: E402
from jaxserve.moe import MoEBlock  # noqa: E402
from jaxserve.moe.parallel import ep_capacity, expert_parallel_moe  # noqa: E402
from jaxserve.parallel import make_mesh  # noqa: E402

T, H = 32, 16
CONFIG = ModelConfig(hidden_size=H, intermediate_size=24, num_experts=8, num_experts_per_tok=2,
                     num_shared_experts=1, router="deepseek_v3", n_group=2, topk_group=1)


def raises(fn, match):
    try:
        fn()
    except ValueError as e:
        assert match in str(e), str(e)
        return
    raise AssertionError(f"no ValueError matching {match!r}")


def expected_drops(experts, shards, n, cap):
    """Assignments past the per-destination capacity, device by device, in token order."""
    drops = 0
    for chunk in np.split(experts, shards):
        dest = chunk.reshape(-1) // (CONFIG.num_experts // n)
        drops += sum(max(0, np.sum(dest == d) - cap) for d in range(n))
    return drops


def main():
    # jitted, not op by op: an eager Flax init and apply compile ~90 one-op programs (~8 s of a 2-core CI worker)
    x = jax.random.normal(jax.random.key(1), (T, H))
    block = MoEBlock(CONFIG)
    weights = jax.jit(block.init)(jax.random.key(0), x)["params"]
    bias = 0.1 * jax.random.normal(jax.random.key(2), (8,))
    ref, stats = jax.jit(lambda w, b, x: block.apply({"params": w, "router_state": {"bias": b}}, x))(weights, bias, x)
    for axes in ({"expert": 8}, {"data": 2, "expert": 4}, {"data": 4, "expert": 2}):
        mesh = make_mesh(axes)
        y, ep = jax.jit(lambda w, x, b: expert_parallel_moe(w, CONFIG, x, mesh, bias=b))(weights, x, bias)
        np.testing.assert_allclose(y, ref, atol=1e-5, err_msg=str(axes))
        np.testing.assert_array_equal(ep.load, stats.load)
        assert int(ep.dropped) == 0, axes
        print(axes, "dropless OK, capacity", ep.capacity)

    mesh = make_mesh({"data": 2, "expert": 4})
    # jitted: shard_map run eagerly executes op by op (~17 s)
    y, ep = jax.jit(lambda w, x, b: expert_parallel_moe(w, CONFIG, x, mesh, bias=b, capacity_factor=0.5))(
        weights, x, bias)
    cap = ep_capacity(T // 8, CONFIG, 4, 0.5)
    assert ep.capacity == cap == 1
    want = expected_drops(np.asarray(stats.experts), 8, 4, cap)
    assert int(ep.dropped) == want > 0, (int(ep.dropped), want)
    print("capacity 0.5: dropped", want, "of", T * 2)

    lowered = jax.jit(lambda w, x: expert_parallel_moe(w, CONFIG, x, mesh, dispatch="ragged")[0]).lower(weights, x)
    assert "ragged_all_to_all" in lowered.as_text()
    print("ragged path lowers (not run: XLA:CPU has no ragged_all_to_all)")

    raises(lambda: expert_parallel_moe(weights, CONFIG, x, make_mesh({"data": 8})), "mesh axis 'expert' missing")
    six = CONFIG.replace(num_experts=6, n_group=1)
    raises(lambda: expert_parallel_moe(weights, six, x, make_mesh({"expert": 4})),
           "num_experts=6 is not divisible by the size 4 of mesh axis 'expert'")
    raises(lambda: expert_parallel_moe(weights, CONFIG, x[:30], mesh), "T divisible by the 8 token shards")
    raises(lambda: expert_parallel_moe(weights, CONFIG, x, mesh, dispatch="nccl"), "dispatch must be one of")
    print("OK")


if __name__ == "__main__":
    main()
