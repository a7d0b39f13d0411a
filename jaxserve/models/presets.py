"""Named model shapes, so experiments and the CLI can say ``model=tiny-llama``."""
from __future__ import annotations

from jaxserve.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    "tiny-llama": ModelConfig(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=176,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                              max_position_embeddings=512),
    "tiny-qwen3": ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=176,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, qk_norm=True,
                              tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=512),
    "small-llama": ModelConfig(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=704,
                               num_layers=6, num_heads=8, num_kv_heads=4, head_dim=32,
                               max_position_embeddings=2048),
    # The bundled zoo models (jaxserve/zoo/): trained on the pycode corpus with its 4096-token BPE.
    "tiny-code": ModelConfig(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=704,
                             num_layers=6, num_heads=8, num_kv_heads=4, head_dim=32,
                             max_position_embeddings=512, eos_token_id=0),
    # 8 routed experts (top-2, DeepSeek-V3-style sigmoid router for loss-free balancing) + 1 shared expert.
    "tiny-code-moe": ModelConfig(model_type="llama", vocab_size=4096, hidden_size=128, intermediate_size=256,
                                 num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                                 max_position_embeddings=512, eos_token_id=0, num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=128, num_shared_experts=1,
                                 router="deepseek_v3"),
    # Hidden 64: with a 4096-token head, a 128-wide draft costs ~1/6 of tiny-code on CPU, not <= 1/8.
    # Two 32-wide heads, not four 16-wide (same parameter shapes): XLA's CPU attention pays per head, and
    # the 4x16 split measured 0.121-0.134 of tiny-code's forward; 2x32 measured 0.099 at i32[8,256], 0.085
    # at [4,64], 0.128 (vs 0.175) at decode-like [1,1] (random weights, idle machine, zoo.forward_seconds).
    "tiny-code-draft": ModelConfig(model_type="llama", vocab_size=4096, hidden_size=64, intermediate_size=192,
                                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                                   max_position_embeddings=512, eos_token_id=0),
    # SmolLM2-135M-Instruct's draft (jaxserve/zoo/smollm2-135m-instruct-draft): its 49152-token vocabulary, a
    # 128-wide tied embedding (the target's, projected: jaxserve.train.draft_init) that is most of its 7.1M
    # parameters, and four narrow layers; a decode step reads ~28 MB in float32 to the target's ~540 MB.
    "smollm2-135m-instruct-draft": ModelConfig(model_type="llama", vocab_size=49152, hidden_size=128,
                                               intermediate_size=384, num_layers=4, num_heads=2, num_kv_heads=1,
                                               head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                                               max_position_embeddings=2048, tie_word_embeddings=True,
                                               bos_token_id=1, eos_token_id=2),
    # Twice as wide (15.7M parameters), for training with a cut head (train.head_vocab_size): tried against the
    # bundled draft on 13x its data, and no better (benchmarks/RESULTS.md, "A retrained SmolLM2 draft").
    "smollm2-135m-instruct-draft-256": ModelConfig(model_type="llama", vocab_size=49152, hidden_size=256,
                                                   intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2,
                                                   head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                                                   max_position_embeddings=2048, tie_word_embeddings=True,
                                                   bos_token_id=1, eos_token_id=2),
    "llama3-8b": ModelConfig(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                             rms_norm_eps=1e-5, max_position_embeddings=8192, dtype="bfloat16"),
    "qwen3-0.6b": ModelConfig(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                              num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, qk_norm=True,
                              tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=40960,
                              dtype="bfloat16"),
    "qwen2-0.5b": ModelConfig(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                              num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, qkv_bias=True,
                              tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768,
                              dtype="bfloat16"),
}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; available: {sorted(PRESETS)}")
    return PRESETS[name]
