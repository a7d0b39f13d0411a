"""Tiny MoE configs shared by the MoE tests."""
from jaxserve.config import ModelConfig


def moe_config(**kw) -> ModelConfig:
    base = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=1,
                head_dim=16, max_position_embeddings=64, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=24)
    return ModelConfig(**{**base, **kw})
