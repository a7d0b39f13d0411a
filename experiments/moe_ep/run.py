"""Time the expert-parallel MoE layer and its all-to-all alone vs tokens per device (8 CPU devices).

    python experiments/moe_ep/run.py [key=value ...]     e.g. tokens_per_device=[16,64] repeats=3

Writes results.json and RESULTS.md into cfg.out_dir. Bytes are those of one padded all_to_all
(dispatch; combine moves the same): the send buffers of all devices, D * N * C * H * 4, and the
live part of it, T * k * H * 4 (what a ragged all-to-all would move; XLA:CPU cannot run one).
"""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import datetime  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config import get_config  # noqa: E402

from jaxserve.config import ModelConfig, apply_overrides  # noqa: E402
from jaxserve.moe import MoEBlock  # noqa: E402
from jaxserve.moe.parallel import ep_capacity, exchange_only, expert_parallel_moe  # noqa: E402
from jaxserve.parallel import make_mesh  # noqa: E402


def median_ms(fn, *args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def point(cfg, model, weights, axes, t_local, cf):
    mesh = make_mesh(axes)
    devices, n = len(mesh.devices.flat), axes["expert"]
    x = jax.random.normal(jax.random.key(t_local), (devices * t_local, cfg.hidden_size))
    cap = ep_capacity(t_local, model, n, cf or None)
    layer = jax.jit(lambda w, x: expert_parallel_moe(w, model, x, mesh, capacity_factor=cf or None))
    dropped = int(layer(weights, x)[1].dropped)
    buf = jnp.zeros((devices * n, cap, cfg.hidden_size), jnp.float32)
    return dict(mesh=",".join(f"{k}={v}" for k, v in axes.items()), tokens_per_device=t_local,
                capacity_factor=cf, capacity=cap, dropped=dropped, assignments=devices * t_local * model.num_experts_per_tok,
                a2a_ms=median_ms(exchange_only(mesh), buf, repeats=cfg.repeats),
                layer_ms=median_ms(layer, weights, x, repeats=cfg.repeats),
                sent_bytes=devices * n * cap * cfg.hidden_size * 4,
                live_bytes=devices * t_local * model.num_experts_per_tok * cfg.hidden_size * 4)


def write(cfg, rows, command):
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = ["# Expert-parallel all-to-all vs tokens per device (8 simulated CPU devices)", "",
             f"Command: `{command}`  ",
             f"Date: {datetime.date.today()}; JAX {jax.__version__} ({jax.default_backend()}); "
             f"machine: 2-core CPU shared with other jobs, 8 devices simulated with "
             f"--xla_force_host_platform_device_count=8; H={cfg.hidden_size}, I={cfg.moe_intermediate_size}, "
             f"E={cfg.num_experts}, k={cfg.num_experts_per_tok}, float32, median of {cfg.repeats} calls.", "",
             "a2a = dispatch + combine all_to_all alone (two collectives on the padded [N, C, H] send buffers); "
             "layer = the whole EP MoE layer (route, pack, a2a, grouped matmul, a2a, combine). "
             "sent = bytes of one padded all_to_all over all devices; live = the routed rows in it.", "",
             "| mesh | tokens/device | capacity factor | C | dropped/assignments | a2a ms | layer ms | "
             "sent MiB | live MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mesh']} | {r['tokens_per_device']} | {r['capacity_factor'] or 'dropless'} | "
                     f"{r['capacity']} | {r['dropped']}/{r['assignments']} | {r['a2a_ms']:.2f} | {r['layer_ms']:.2f} | "
                     f"{r['sent_bytes'] / 2**20:.2f} | {r['live_bytes'] / 2**20:.2f} |")
    with open(os.path.join(cfg.out_dir, "RESULTS.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    cfg = apply_overrides(get_config(), argv)
    model = ModelConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.moe_intermediate_size,
                        num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok, router="qwen3_moe")
    weights = MoEBlock(model).init(jax.random.key(0), jnp.zeros((1, cfg.hidden_size)))["params"]
    rows = []
    for spec in cfg.meshes:
        axes = {k: int(v) for k, v in (a.split("=") for a in spec.split(","))}
        for t_local in cfg.tokens_per_device:
            for cf in cfg.capacity_factors:
                rows.append(point(cfg, model, weights, axes, t_local, cf))
                print(rows[-1], flush=True)
    write(cfg, rows, " ".join(["python", "experiments/moe_ep/run.py", *map(shlex.quote, argv)]))


if __name__ == "__main__":
    main(sys.argv[1:])
