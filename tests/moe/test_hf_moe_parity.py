"""Logits parity with Hugging Face transformers on tiny random Mixtral, Qwen3-MoE and Qwen2-MoE (float32)."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxserve.models import forward_full, load_hf  # noqa: E402
from jaxserve.models.hf import config_from_hf  # noqa: E402

pytestmark = pytest.mark.peers
FORWARD = jax.jit(forward_full, static_argnums=1)  # eager dispatch of the MoE ops is ~3x slower on CPU

COMMON = dict(vocab_size=97, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, rope_theta=5000.0)
CASES = {
    "mixtral": (transformers.MixtralForCausalLM, transformers.MixtralConfig,
                dict(intermediate_size=48, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)),
    # layer 0 dense (decoder_sparse_step=2), layer 1 MoE; top-3 of 6 without renormalisation
    # (norm_topk_prob=True is checked against the formula in test_routers.py)
    "qwen3_moe": (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig,
                  dict(intermediate_size=80, moe_intermediate_size=32, num_hidden_layers=2, num_experts=6,
                       num_experts_per_tok=3, decoder_sparse_step=2, norm_topk_prob=False, head_dim=24)),
    # sigmoid-gated shared expert of its own width, q/k/v biases
    "qwen2_moe": (transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig,
                  dict(intermediate_size=80, moe_intermediate_size=32, shared_expert_intermediate_size=40,
                       num_hidden_layers=1, num_experts=4, num_experts_per_tok=2)),
}


def make_hf_model(case, seed=0):
    cls, config_cls, extra = CASES[case]
    torch.manual_seed(seed)
    model = cls(config_cls(**COMMON, **extra)).eval()
    with torch.no_grad():  # norms start at one and the router at zero in HF: randomise both
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("gate.weight"):
                p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    model = make_hf_model(case)
    model.save_pretrained(tmp_path)
    config, params = load_hf(tmp_path)
    assert config.num_experts == CASES[case][2].get("num_local_experts", CASES[case][2].get("num_experts"))
    tokens = np.random.default_rng(1).integers(0, 97, (2, 19))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    got = np.asarray(FORWARD(params, config, jnp.asarray(tokens)))
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_qwen3_moe_dense_layers_follow_decoder_sparse_step(tmp_path):
    model = make_hf_model("qwen3_moe")
    model.save_pretrained(tmp_path)
    config, params = load_hf(tmp_path)
    assert [config.is_moe_layer(i) for i in range(2)] == [False, True]
    assert params["layers_0"]["mlp"]["gate_proj"]["kernel"].shape == (64, 80)
    assert params["layers_1"]["mlp"]["gate_proj"].shape == (6, 64, 32)


def test_deepseek_v3_is_a_clear_error():
    hf = json.loads(transformers.DeepseekV3Config(num_hidden_layers=1).to_json_string())
    with pytest.raises(ValueError, match="MLA.*not supported yet"):
        config_from_hf(hf)


def test_missing_expert_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file
    make_hf_model("mixtral").save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"experts\.3\.w2\.weight"):
        load_hf(tmp_path)
