"""Bytes moved by collectives per decode step, for each mesh layout, on 8 simulated CPU devices.

    python benchmarks/mesh_collectives.py [--batch 16] [--hidden 256] [--layers 4] [--out results/mesh_collectives/results.json]

Reads the compiled HLO of the engine's decode program (``ModelRunner.compiled_text``, counted by
``jaxserve.parallel.hlo.collectives``: each op's result bytes, per device) for a random dense Llama, a random
Qwen3-MoE and a random Mixtral, and prints it beside the layout's prediction (``--out``: also a results.json,
the figures of the RESULTS.md claim):

- tensor parallelism: an all-reduce of the [B, E] activations after o_proj and after the MLP (dense: down_proj;
  MoE without expert parallelism: each expert split on its intermediate dim, one psum): 2 L B E x 4 bytes;
  with expert parallelism only the o_proj one, L B E x 4;
- expert parallelism over N = D x T devices (padded, dropless): per MoE layer three all_to_alls, of the
  rows [N, C, E], their expert ids [N, C] and the results [N, C, E], C = ceil(B / N) min(k, E / N):
  N C (2E + 1) x 4 bytes per layer, then an all-gather of the combined [B, E] output (L B E x 4). GSPMD
  also gathers the router's probabilities [B, num_experts] (measured, not predicted).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import subprocess
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402

from jaxserve import LLM  # noqa: E402
from jaxserve.bench.throughput import machine  # noqa: E402
from jaxserve.config import ModelConfig  # noqa: E402
from jaxserve.models import init_params  # noqa: E402
from jaxserve.parallel.hlo import collectives  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
LAYOUTS = [("llama", 2, False, 1), ("llama", 4, False, 1), ("llama", 8, False, 1),
           ("qwen3_moe", 2, False, 1), ("qwen3_moe", 4, False, 1), ("qwen3_moe", 8, False, 1),
           ("mixtral", 2, False, 1), ("mixtral", 4, False, 1),
           ("qwen3_moe", 2, True, 1), ("qwen3_moe", 1, True, 4), ("qwen3_moe", 2, True, 2), ("qwen3_moe", 1, True, 8)]


def configs(hidden: int, layers: int) -> dict[str, ModelConfig]:
    base = dict(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers, num_heads=8,
                num_kv_heads=4, head_dim=hidden // 8, max_position_embeddings=256)
    moe = dict(num_experts=8, num_experts_per_tok=2, **base)
    return {"llama": ModelConfig(**base),
            "qwen3_moe": ModelConfig(model_type="qwen3_moe", qk_norm=True, moe_intermediate_size=hidden // 2,
                                     router="qwen3_moe", **moe),
            "mixtral": ModelConfig(model_type="mixtral", router="mixtral", **moe)}


def predicted(config: ModelConfig, b: int, t: int, ep: bool, d: int) -> dict[str, int]:
    e, out = config.hidden_size, {}
    if t > 1:  # after o_proj, and after the MLP unless its experts are expert-parallel
        out["all-reduce"] = (1 if ep else 2) * config.num_layers * b * e * 4
    if ep:
        n = d * t
        cap = math.ceil(b / n) * min(config.num_experts_per_tok, config.num_experts // n)
        out["all-to-all"] = config.num_layers * n * cap * (2 * e + 1) * 4
        out["all-gather"] = config.num_layers * b * e * 4  # the combined [B, E] output back to every device
    return out


def measure(config: ModelConfig, batch: int, t: int, ep: bool, d: int) -> dict:
    llm = LLM.from_params(config, init_params(config, jax.random.key(0)), num_kv_blocks=64, block_size=16,
                          max_num_seqs=batch, attention_impl="xla", tensor_parallel_size=t,
                          enable_expert_parallel=ep, data_parallel_size=d)
    runner = llm.engine.runner
    shape = [s for s in runner.buckets.decode_shapes() if s[0] == batch][0]
    got = collectives(runner.compiled_text(shape))
    want = predicted(config, shape[0], t, ep, d)
    return {"T": t, "EP": ep, "D": d, "batch": shape[0],
            "collectives": {op: {"count": c.count, "bytes": c.bytes} for op, c in sorted(got.items())},
            "predicted": want, "measured_bytes": sum(c.bytes for c in got.values()),
            "predicted_bytes": sum(want.values()),
            "unpredicted_bytes": sum(c.bytes for op, c in got.items() if op not in want)}


def meta(argv: list[str]) -> dict:
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "jaxserve", "benchmarks")
    return {"benchmark": "mesh_collectives", "command": "python benchmarks/mesh_collectives.py " + " ".join(argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "jax_version": jax.__version__, "devices": f"{jax.device_count()} simulated CPU",
            "git_commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=None, help="write the rows to this results.json")
    args = ap.parse_args(argv)
    models, run = configs(args.hidden, args.layers), meta(argv)  # the commit of the code that runs, not of the end
    rows = []
    print("| model | T | EP | D | B | collective: count, bytes per device (HLO) | predicted bytes |")
    print("|---|---|---|---|---|---|---|")
    for name, t, ep, d in LAYOUTS:
        row = {"model": name, **measure(models[name], args.batch, t, ep, d)}
        rows.append(row)
        measured = ", ".join(f"{op} {c['count']}, {c['bytes']:,}" for op, c in row["collectives"].items())
        want = ", ".join(f"{op} {v:,}" for op, v in row["predicted"].items())
        print(f"| {name} | {t} | {'on' if ep else 'off'} | {d} | {row['batch']} | {measured} | {want} |", flush=True)
    if args.out:
        config = {"batch": args.batch, "hidden": args.hidden, "layers": args.layers,
                  "models": {n: {k: getattr(c, k) for k in ("model_type", "num_heads", "num_kv_heads", "num_experts",
                                                           "expert_intermediate_size")} for n, c in models.items()}}
        path = pathlib.Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": run, "config": config, "tables": {"layouts": rows}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
