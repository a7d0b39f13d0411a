"""Bad Hugging Face directories raise errors that name the problem."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxserve.models import load_hf

CONFIG = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
          "tie_word_embeddings": True}


def tensors(config):
    h, i, v, d = config["hidden_size"], config["intermediate_size"], config["vocab_size"], 4
    t = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
         "model.layers.0.input_layernorm.weight": (h,), "model.layers.0.post_attention_layernorm.weight": (h,),
         "model.layers.0.self_attn.q_proj.weight": (2 * d, h), "model.layers.0.self_attn.k_proj.weight": (d, h),
         "model.layers.0.self_attn.v_proj.weight": (d, h), "model.layers.0.self_attn.o_proj.weight": (h, 2 * d),
         "model.layers.0.mlp.gate_proj.weight": (i, h), "model.layers.0.mlp.up_proj.weight": (i, h),
         "model.layers.0.mlp.down_proj.weight": (h, i)}
    return {k: np.ones(s, np.float32) for k, s in t.items()}


def write(path, config, t):
    (path / "config.json").write_text(json.dumps(config))
    save_file(t, str(path / "model.safetensors"))


def test_well_formed_directory_loads(tmp_path):
    write(tmp_path, CONFIG, tensors(CONFIG))
    config, _ = load_hf(tmp_path)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (2, 1, 4)


def test_unsupported_model_type(tmp_path):
    write(tmp_path, {**CONFIG, "model_type": "gpt2"}, tensors(CONFIG))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_hf(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    t = tensors(CONFIG)
    del t["model.layers.0.mlp.up_proj.weight"]
    write(tmp_path, CONFIG, t)
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.0\.mlp\.up_proj\.weight'"):
        load_hf(tmp_path)


def test_shape_mismatch_is_named(tmp_path):
    t = tensors(CONFIG)
    t["model.layers.0.self_attn.k_proj.weight"] = np.ones((5, 8), np.float32)
    write(tmp_path, CONFIG, t)
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \(5, 8\), expected \(4, 8\)"):
        load_hf(tmp_path)


def test_unexpected_tensor_is_named(tmp_path):
    t = tensors(CONFIG)
    t["model.layers.0.self_attn.rogue.weight"] = np.ones((2,), np.float32)
    write(tmp_path, CONFIG, t)
    with pytest.raises(ValueError, match="rogue"):
        load_hf(tmp_path)


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_hf(tmp_path)


def test_scaled_rope_is_refused(tmp_path):
    write(tmp_path, {**CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, tensors(CONFIG))
    with pytest.raises(ValueError, match="unsupported rope scaling 'yarn'"):
        load_hf(tmp_path)
