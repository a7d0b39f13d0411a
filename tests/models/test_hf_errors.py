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


# ---- issue 25, finding 4: which file holds a tensor, non-float dtypes, malformed config.json ----

def split(t, first):
    """Two shards: the tensors named in ``first`` and the rest."""
    return {k: v for k, v in t.items() if k in first}, {k: v for k, v in t.items() if k not in first}


def write_index(path, weight_map):
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_index_decides_which_file_holds_each_tensor(tmp_path):
    rng = np.random.default_rng(0)
    t = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in tensors(CONFIG).items()}
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    a, b = split(t, ["model.embed_tokens.weight", "model.norm.weight"])
    save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    # a stale file, last in glob order, with other values for every tensor: the index must win
    save_file({k: v + 1 for k, v in t.items()}, str(tmp_path / "zz-stale.safetensors"))
    write_index(tmp_path, {k: ("model-00001-of-00002.safetensors" if k in a else "model-00002-of-00002.safetensors")
                           for k in t})
    _, params = load_hf(tmp_path)
    np.testing.assert_array_equal(np.asarray(params["embed"]["embedding"]), t["model.embed_tokens.weight"])
    np.testing.assert_array_equal(np.asarray(params["layers_0"]["mlp"]["up_proj"]["kernel"]),
                                  t["model.layers.0.mlp.up_proj.weight"].T)


def test_index_naming_a_missing_file_or_tensor(tmp_path):
    write(tmp_path, CONFIG, tensors(CONFIG))
    write_index(tmp_path, {k: "model.safetensors" for k in tensors(CONFIG)} | {"model.extra.weight": "model.safetensors"})
    with pytest.raises(ValueError, match=r"puts tensor 'model\.extra\.weight' in model\.safetensors, which does not hold it"):
        load_hf(tmp_path)
    write_index(tmp_path, {k: "gone.safetensors" for k in tensors(CONFIG)})
    with pytest.raises(ValueError, match=r"in gone\.safetensors, which does not exist"):
        load_hf(tmp_path)


def test_tensor_in_two_files_without_an_index_names_both(tmp_path):
    write(tmp_path, CONFIG, tensors(CONFIG))
    save_file({"model.norm.weight": np.zeros(8, np.float32)}, str(tmp_path / "stale.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'model\.norm\.weight' is in both model\.safetensors and stale\.safetensors"):
        load_hf(tmp_path)


@pytest.mark.parametrize("dtype, name", [(np.int8, "I8"), (np.uint8, "U8"), (np.int32, "I32"), (np.bool_, "BOOL")])
def test_non_float_tensors_are_rejected_not_cast(tmp_path, dtype, name):
    t = tensors(CONFIG)
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"].astype(dtype)
    write(tmp_path, CONFIG, t)
    with pytest.raises(ValueError, match=rf"tensor 'model\.layers\.0\.mlp\.down_proj\.weight' in model\.safetensors "
                                         rf"has dtype {name}"):
        load_hf(tmp_path)


@pytest.mark.parametrize("config, message", [
    ([], r"config\.json must hold a JSON object, got list \[\]"),
    ("llama", r"config\.json must hold a JSON object, got str"),
    ({k: v for k, v in CONFIG.items() if k != "hidden_size"}, r"config\.json lacks the required key 'hidden_size'"),
    ({k: v for k, v in CONFIG.items() if k != "model_type"}, r"config\.json lacks the required key 'model_type'"),
    ({**CONFIG, "vocab_size": "4096"}, r"config\.json: vocab_size must be an integer, got '4096' \(str\)"),
    ({**CONFIG, "num_attention_heads": 2.0}, r"config\.json: num_attention_heads must be an integer, got 2\.0"),
    ({**CONFIG, "hidden_size": -8}, r"config\.json: hidden_size must be > 0, got -8"),
    ({**CONFIG, "rope_theta": "1e4"}, r"config\.json: rope_theta must be a finite number > 0, got '1e4'"),
    ({**CONFIG, "tie_word_embeddings": "true"}, r"config\.json: tie_word_embeddings must be true or false, got 'true'"),
    ({**CONFIG, "rope_scaling": "linear"}, r"config\.json: rope_scaling must be an object or null, got 'linear'"),
    ({**CONFIG, "eos_token_id": [1.5]}, r"config\.json: eos_token_id must be an integer or a non-empty list"),
])
def test_malformed_config_json_is_a_clear_value_error(tmp_path, config, message):
    write(tmp_path, config, tensors(CONFIG))
    with pytest.raises(ValueError, match=message):
        load_hf(tmp_path)


def test_config_json_that_is_not_json(tmp_path):
    write(tmp_path, CONFIG, tensors(CONFIG))
    (tmp_path / "config.json").write_text("{vocab_size: 16")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        load_hf(tmp_path)


def test_unreadable_safetensors_file_is_named(tmp_path):
    write(tmp_path, CONFIG, tensors(CONFIG))
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        load_hf(tmp_path)
