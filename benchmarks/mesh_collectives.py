"""Bytes moved by collectives per decode step, for each mesh layout, on 8 simulated CPU devices.

    python benchmarks/mesh_collectives.py [--batch 16] [--hidden 256] [--layers 4]

Reads the compiled HLO of the engine's decode program (``ModelRunner.compiled_text``, counted by
``jaxserve.parallel.hlo.collectives``: each op's result bytes, per device) for a random dense Llama and a
random Qwen3-MoE, and prints it beside the layout's prediction:

- tensor parallelism: an all-reduce of the [B, E] activations after o_proj and (dense layers) after
  down_proj: 2 L B E x 4 bytes for a dense model, L B E x 4 for an MoE (its experts are not row-parallel);
- expert parallelism over N = D x T devices (padded, dropless): per MoE layer three all_to_alls, of the
  rows [N, C, E], their expert ids [N, C] and the results [N, C, E], C = ceil(B / N) min(k, E / N):
  N C (2E + 1) x 4 bytes per layer, then an all-gather of the combined [B, E] output (L B E x 4). GSPMD
  also gathers the router's probabilities [B, num_experts] (measured, not predicted).
"""
from __future__ import annotations

import argparse
import math
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402

from jaxserve import LLM  # noqa: E402
from jaxserve.config import ModelConfig  # noqa: E402
from jaxserve.models import init_params  # noqa: E402
from jaxserve.parallel.hlo import collectives  # noqa: E402

LAYOUTS = [("llama", 2, False, 1), ("llama", 4, False, 1), ("llama", 8, False, 1), ("qwen3_moe", 2, False, 1),
           ("qwen3_moe", 2, True, 1), ("qwen3_moe", 1, True, 4), ("qwen3_moe", 2, True, 2), ("qwen3_moe", 1, True, 8)]


def configs(hidden: int, layers: int) -> dict[str, ModelConfig]:
    base = dict(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers, num_heads=8,
                num_kv_heads=4, head_dim=hidden // 8, max_position_embeddings=256)
    return {"llama": ModelConfig(**base),
            "qwen3_moe": ModelConfig(model_type="qwen3_moe", qk_norm=True, num_experts=8, num_experts_per_tok=2,
                                     moe_intermediate_size=hidden // 2, router="qwen3_moe", **base)}


def predicted(config: ModelConfig, b: int, t: int, ep: bool, d: int) -> dict[str, int]:
    e, out = config.hidden_size, {}
    if t > 1:
        # after o_proj, and after down_proj in a dense layer (experts are not row-parallel: replicated or EP)
        out["all-reduce"] = (1 if config.num_experts else 2) * config.num_layers * b * e * 4
    if ep:
        n = d * t
        cap = math.ceil(b / n) * min(config.num_experts_per_tok, config.num_experts // n)
        out["all-to-all"] = config.num_layers * n * cap * (2 * e + 1) * 4
        out["all-gather"] = config.num_layers * b * e * 4  # the combined [B, E] output back to every device
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args(argv)
    models = configs(args.hidden, args.layers)
    print(f"| model | T | EP | D | B | collective: count, bytes per device (HLO) | predicted bytes |")
    print("|---|---|---|---|---|---|---|")
    for name, t, ep, d in LAYOUTS:
        config = models[name]
        llm = LLM.from_params(config, init_params(config, jax.random.key(0)), num_kv_blocks=64, block_size=16,
                              max_num_seqs=args.batch, attention_impl="xla", tensor_parallel_size=t,
                              enable_expert_parallel=ep, data_parallel_size=d)
        runner = llm.engine.runner
        shape = [s for s in runner.buckets.decode_shapes() if s[0] == args.batch][0]
        got = collectives(runner.compiled_text(shape))
        measured = ", ".join(f"{op} {c.count}, {c.bytes:,}" for op, c in sorted(got.items()))
        want = ", ".join(f"{op} {v:,}" for op, v in predicted(config, shape[0], t, ep, d).items())
        print(f"| {name} | {t} | {'on' if ep else 'off'} | {d} | {shape[0]} | {measured} | {want} |", flush=True)


if __name__ == "__main__":
    main()
