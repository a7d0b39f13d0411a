"""The engine on a mesh of 8 simulated CPU devices gives the one-device outputs, for every layout.

Run by test_mesh.py in a subprocess (XLA_FLAGS must be set before jax is imported). One process runs
every check (compiling is what costs); prints one line per check and "OK" last.
Usage: python tests/parallel/mesh_check.py [--slow]   (--slow: the whole grid of layouts and models)
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxserve import LLM, SamplingParams  # noqa: E402
from jaxserve.config import ModelConfig  # noqa: E402
from jaxserve.models import init_params  # noqa: E402

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=8, max_position_embeddings=128, eos_token_id=None)
MODELS = {  # tiny random models of the three families (HF's config names)
    "llama": ModelConfig(model_type="llama", **BASE),
    "qwen3_moe": ModelConfig(model_type="qwen3_moe", qk_norm=True, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=16, router="qwen3_moe", **BASE),
    "mixtral": ModelConfig(model_type="mixtral", num_experts=8, num_experts_per_tok=2, router="mixtral", **BASE),
}
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=32, attention_impl="xla")
PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 3], [11, 4, 8, 15, 16, 23, 42, 8, 1]]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=1.0, top_k=20, seed=3, ignore_eos=True)
LAYOUTS = [(1, False, 1), (2, False, 1), (4, False, 1), (2, True, 1), (1, True, 4), (2, True, 2)]


def tokens(llm, params):
    return [[c.token_ids for c in o.outputs] for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def layout_kw(t, ep, d):
    return dict(tensor_parallel_size=t, enable_expert_parallel=ep, data_parallel_size=d)


def check_grid(names, layouts):
    for name in names:
        config = MODELS[name]
        params = init_params(config, jax.random.key(0))
        ref = None
        for t, ep, d in layouts:
            if ep and not config.num_experts:
                continue
            llm = LLM.from_params(config, params, **ENGINE, **layout_kw(t, ep, d))
            got = (tokens(llm, GREEDY), tokens(llm, SEEDED))
            ref = got if ref is None else ref
            assert got == ref, (name, t, ep, d, got, ref)
            print(f"{name} T={t} EP={ep} D={d}: greedy and seeded equal", flush=True)


def main(slow: bool):
    check_grid(["llama", "qwen3_moe", "mixtral"] if slow else ["llama", "qwen3_moe"],
               LAYOUTS if slow else [(1, False, 1), (2, False, 1), (2, True, 2)])
    print("OK")


if __name__ == "__main__":
    main("--slow" in sys.argv)
