"""save_hf writes a directory that load_hf and transformers both read back to the same model."""
import re

import jax
import numpy as np
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models import get_preset, init_params, load_hf
from jaxserve.models.hf import config_from_hf
from jaxserve.models.hf_export import hf_config, save_hf
from tests.reference_forward import reference_logits

MOE = dict(vocab_size=97, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24,
           max_position_embeddings=128, rope_theta=5000.0)
CONFIGS = {
    "tiny-llama": get_preset("tiny-llama"),
    "tiny-qwen3": get_preset("tiny-qwen3"),
    "mixtral": ModelConfig(model_type="mixtral", intermediate_size=48, moe_intermediate_size=48, num_experts=4,
                           router="mixtral", **MOE),
    # layer 0 dense, layer 1 MoE (decoder_sparse_step=2); top-3 of 6, renormalised
    "qwen3_moe": ModelConfig(model_type="qwen3_moe", qk_norm=True, intermediate_size=80, moe_intermediate_size=32,
                             num_experts=6, num_experts_per_tok=3, moe_layer_freq=2, router="qwen3_moe",
                             norm_topk_prob=True, **MOE),
    # a sigmoid-gated shared expert of its own width, q/k/v biases; top-2 of 4, not renormalised
    "qwen2_moe": ModelConfig(model_type="qwen2_moe", qkv_bias=True, intermediate_size=80, moe_intermediate_size=32,
                             num_experts=4, num_shared_experts=1, shared_expert_intermediate_size=40,
                             shared_expert_gate=True, router="qwen3_moe", norm_topk_prob=False, **MOE),
}


def random_params(config, seed=0):
    """init_params with its norms (ones) and biases (zeros) moved off their init, so that mapping any of them
    onto the wrong HF tensor changes the logits."""
    params = init_params(config, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.2 * rng.standard_normal(x.shape, np.float32) if path[-1].key in ("scale", "bias") else x,
        params)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_round_trip_and_transformers_agrees(tmp_path, name):
    config = CONFIGS[name]
    params = random_params(config)
    save_hf(tmp_path / "m", config, params)
    config2, params2 = load_hf(tmp_path / "m")
    assert config2 == config
    assert jax.tree.structure(params2) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(a, b)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    assert type(model).__name__ == hf_config(config)["architectures"][0]
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, 19))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(reference_logits(params, config, tokens), expected, atol=1e-4, rtol=0)


def test_moe_widths_are_spelled_out():
    """moe_intermediate_size=0 ("as intermediate_size") exports; the config read back names the width."""
    config = CONFIGS["mixtral"].replace(moe_intermediate_size=0)
    assert config_from_hf(hf_config(config)) == CONFIGS["mixtral"]


@pytest.mark.parametrize("name, change, message", [
    ("mixtral", dict(router="qwen3_moe"), "router='qwen3_moe' (it reads back as 'mixtral')"),
    ("mixtral", dict(qkv_bias=True, o_bias=True), "qkv_bias=True"),
    ("mixtral", dict(moe_intermediate_size=32), "moe_intermediate_size=32 (it reads back as 48)"),
    ("qwen3_moe", dict(num_shared_experts=1), "num_shared_experts=1 (it reads back as 0)"),
    ("qwen3_moe", dict(first_k_dense=1), "first_k_dense=1"),
    ("qwen3_moe", dict(moe_capacity_factor=1.25), "moe_capacity_factor=1.25"),
    ("qwen2_moe", dict(shared_expert_gate=False), "shared_expert_gate=False"),
    ("tiny-llama", dict(sliding_window=8), "sliding_window=8"),
])
def test_unexpressible_config_is_an_error_before_writing(tmp_path, name, change, message):
    config = CONFIGS[name].replace(**change)
    with pytest.raises(ValueError, match=f"cannot export {config.model_type}: .*" + re.escape(message)):
        save_hf(tmp_path / "m", config, {})  # refused before the params are read
    assert not (tmp_path / "m").exists()
