"""Expert-parallel MoE: the all-to-all alone and the whole layer vs tokens per device (8 simulated CPU devices).

    python -m experiments.moe_ep [key=value ...]     e.g. tokens_per_device=[16,64] repeats=3

Bytes are those of one padded all_to_all (dispatch; combine moves the same): the send buffers of
all devices, D * N * C * H * 4, and the live part of it, T * k * H * 4 (what a ragged all-to-all
would move; XLA:CPU cannot run one). ``__main__.py`` asks XLA for 8 host devices before jax loads.
"""
import itertools
import time

import jax
import jax.numpy as jnp

from jaxserve.config import ModelConfig
from jaxserve.moe import MoEBlock
from jaxserve.moe.parallel import ep_capacity, exchange_only, expert_parallel_moe
from jaxserve.parallel import make_mesh


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


def parse_mesh(spec):
    """"data=2,expert=4" -> {"data": 2, "expert": 4}."""
    return {k: int(v) for k, v in (a.split("=") for a in spec.split(","))}


def plot(axes, rows):
    for mesh, cf in dict.fromkeys((r["mesh"], r["capacity_factor"]) for r in rows):
        rs = [r for r in rows if r["mesh"] == mesh and r["capacity_factor"] == cf]
        label = f"{mesh}, {'dropless' if not cf else f'cf {cf}'}"
        t = [r["tokens_per_device"] for r in rs]
        axes[0].plot(t, [r["a2a_ms"] for r in rs], "o-", label=label)
        axes[1].plot(t, [r["layer_ms"] for r in rs], "o-", label=label)
    for ax, what in zip(axes, ["dispatch + combine all_to_all (ms)", "whole EP MoE layer (ms)"]):
        ax.set(xscale="log", yscale="log", xlabel="tokens per device", ylabel=what)
    axes[0].legend(fontsize="small")


def run(cfg, out):
    if jax.device_count() < 8:
        raise RuntimeError(f"moe_ep needs 8 devices, jax has {jax.device_count()}: "
                           "run it as python -m experiments.moe_ep (its __main__ sets XLA_FLAGS)")
    model = ModelConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.moe_intermediate_size,
                        num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok, router="qwen3_moe")
    weights = MoEBlock(model).init(jax.random.key(0), jnp.zeros((1, cfg.hidden_size)))["params"]
    units = list(itertools.product(cfg.meshes, cfg.tokens_per_device, cfg.capacity_factors))
    rows = [point(cfg, model, weights, parse_mesh(spec), t_local, cf)
            for spec, t_local, cf in out.progress(units, desc="points")]
    out.text(f"H={cfg.hidden_size}, I={cfg.moe_intermediate_size}, E={cfg.num_experts}, k={cfg.num_experts_per_tok}, "
             f"float32, median of {cfg.repeats} calls; the 8 devices are simulated with "
             "--xla_force_host_platform_device_count=8 (threads of one CPU process).\n\n"
             "a2a = dispatch + combine all_to_all alone (two collectives on the padded [N, C, H] send buffers); "
             "layer = the whole EP MoE layer (route, pack, a2a, grouped matmul, a2a, combine). "
             "sent = bytes of one padded all_to_all over all devices; live = the routed rows in it.")
    out.table("points", rows, {"mesh": "mesh", "tokens_per_device": "tokens/device",
                               "capacity_factor": "capacity factor", "capacity": "C",
                               "dropped": "dropped/assignments", "a2a_ms": "a2a ms", "layer_ms": "layer ms",
                               "sent_bytes": "sent MiB", "live_bytes": "live MiB"},
              fmt={"capacity_factor": lambda r: str(r["capacity_factor"] or "dropless"),
                   "dropped": lambda r: f"{r['dropped']}/{r['assignments']}", "a2a_ms": ".2f", "layer_ms": ".2f",
                   "sent_bytes": lambda r: f"{r['sent_bytes'] / 2**20:.2f}",
                   "live_bytes": lambda r: f"{r['live_bytes'] / 2**20:.2f}"})
    with out.figure("time_vs_tokens", "all_to_all alone and the whole layer vs tokens per device", ncols=2,
                    figsize=(10, 4)) as axes:
        plot(axes, rows)


if __name__ == "__main__":  # an alias of python -m experiments.moe_ep
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    sys.exit(subprocess.call([sys.executable, "-m", "experiments.moe_ep", *sys.argv[1:]], env=env))
