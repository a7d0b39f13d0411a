"""Tiny random models of the Llama, Qwen3-MoE and Mixtral families and an engine over them, for the mesh checks
(importing this sets no XLA flags: the check scripts do, before jax starts)."""
import jax

from jaxserve import LLM, SamplingParams, SpeculativeConfig
from jaxserve.config import ModelConfig
from jaxserve.models import init_params

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=8, max_position_embeddings=128, eos_token_id=None)
MODELS = {  # tiny random models of the three families (HF's config names; HF parity: tests/moe, tests/models)
    "llama": ModelConfig(model_type="llama", **BASE),
    "qwen3_moe": ModelConfig(model_type="qwen3_moe", qk_norm=True, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=16, router="qwen3_moe", **BASE),
    "mixtral": ModelConfig(model_type="mixtral", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                           router="mixtral", **BASE),  # experts intermediate_size wide, spelled out as load_hf does
    "llama_d16": ModelConfig(model_type="llama", **{**BASE, "head_dim": 16}),  # o_proj K=64: MXFP4 blocks at T=2
}
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=32, attention_impl="xla")
PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 3], [11, 4, 8, 15, 16, 23, 42, 8, 1]]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=1.0, top_k=20, seed=3, ignore_eos=True)
PARAMS = {}


def params_of(name):
    if name not in PARAMS:
        # jitted: Flax's init run eagerly compiles a one-op program per op of the model's forward (~5 s a process)
        PARAMS[name] = jax.jit(init_params, static_argnums=0)(MODELS[name], jax.random.key(0))
    return PARAMS[name]


DRAFT = MODELS["llama"].replace(num_layers=1, hidden_size=16, head_dim=4, intermediate_size=32, num_heads=2,
                                num_kv_heads=1)


def make_spec(method, t=1, name="llama", **kw):
    """Tiny ``name`` with a speculative proposer: the 1-layer Llama ``DRAFT`` for "draft_model" (every family here
    shares its vocabulary), Medusa heads, or none."""
    from jaxserve.speculative.medusa import MedusaConfig, init_medusa_params
    heads = MedusaConfig(hidden_size=BASE["hidden_size"], vocab_size=BASE["vocab_size"], num_heads=2)
    draft = {"draft_model": lambda: (DRAFT, init_params(DRAFT, jax.random.key(1))),
             "medusa": lambda: (heads, init_medusa_params(heads, params_of(name), MODELS[name]))}.get(method)
    return make(name, t, speculative=SpeculativeConfig(method=method, num_speculative_tokens=2),
                draft=draft and draft(), **kw)


def make(name, t=1, ep=False, d=1, **kw):
    return LLM.from_params(MODELS[name], params_of(name), **{**ENGINE, **kw}, tensor_parallel_size=t,
                           enable_expert_parallel=ep, data_parallel_size=d)


def tokens(llm, params, prompts=PROMPTS):
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
