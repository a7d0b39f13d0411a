"""config.json -> ModelConfig for Llama 3.x, Mistral and Gemma 3 text: both config formats, HF's defaults,
and a clear error for what is not supported (no torch needed)."""
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models.hf import config_from_hf
from jaxserve.layers import rope_inv_freq

BASE = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.mark.parametrize("rope", [
    {"rope_scaling": LLAMA3, "rope_theta": 5e5},  # the legacy format of Llama 3.1 hub configs
    {"rope_parameters": {**LLAMA3, "rope_theta": 5e5}},  # transformers 5
])
def test_llama3_rope_both_formats(rope):
    c = config_from_hf({**BASE, "model_type": "llama", **rope})
    assert (c.rope_type, c.rope_theta, c.rope_factor, c.rope_original_max_position) == ("llama3", 5e5, 8.0, 64)


def test_llama3_inverse_frequencies():
    """High frequencies kept, low ones divided by the factor, the band between interpolated."""
    base = rope_inv_freq(64, 5e5)
    scaled = rope_inv_freq(64, 5e5, "llama3", 8.0, 1.0, 4.0, 64)
    wavelen = 2 * 3.141592653589793 / base
    assert (scaled[wavelen < 16] == base[wavelen < 16]).all()
    assert (abs(scaled[wavelen > 64] - base[wavelen > 64] / 8) <= 1e-6 * base[wavelen > 64]).all()
    band = (wavelen >= 16) & (wavelen <= 64)
    assert band.any() and ((scaled[band] < base[band]) & (scaled[band] > base[band] / 8)).all()


@pytest.mark.parametrize("rope, match", [
    ({"rope_type": "yarn", "factor": 4.0}, "unsupported rope scaling 'yarn'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "needs 'high_freq_factor'"),
    ({"rope_type": "linear"}, "needs 'factor'"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_rope_is_a_clear_error(rope, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf({**BASE, "model_type": "llama", "rope_scaling": rope})


def test_mistral_window_and_its_default():
    assert config_from_hf({**BASE, "model_type": "mistral", "sliding_window": None}).sliding_window is None
    assert config_from_hf({**BASE, "model_type": "mistral", "sliding_window": 8}).layer_window(3) == 8
    assert config_from_hf({**BASE, "model_type": "mistral"}).sliding_window == 4096  # MistralConfig's default


GEMMA3 = {**BASE, "model_type": "gemma3_text", "head_dim": 8, "sliding_window": 4}


def test_gemma3_legacy_hub_config():
    """The keys of the Gemma 3 hub configs: sliding_window_pattern, rope_local_base_freq, rope_scaling."""
    c = config_from_hf({**GEMMA3, "sliding_window_pattern": 2, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                        "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert c.layer_types == ("sliding_attention", "full_attention") * 2
    assert [c.layer_window(i) for i in range(4)] == [4, None, 4, None]
    assert (c.rope_theta, c.rope_type, c.rope_factor, c.rope_local_theta) == (1e6, "linear", 8.0, 1e4)
    assert c.tie_word_embeddings and c.query_pre_attn_scalar == 256 and c.hidden_act == "gelu_tanh"
    assert c.norm_unit_offset and c.sandwich_norms and c.scale_embeddings and c.qk_norm


def test_gemma3_transformers5_config():
    c = config_from_hf({**GEMMA3, "layer_types": ["full_attention"] * 3 + ["sliding_attention"],
                        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
                        "final_logit_softcapping": 30.0, "tie_word_embeddings": False})
    assert [c.layer_window(i) for i in range(4)] == [None, None, None, 4]
    assert (c.rope_theta, c.rope_local_theta, c.final_logit_softcap) == (5e5, 50.0, 30.0)
    assert not c.tie_word_embeddings


@pytest.mark.parametrize("extra, match", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}}, "sliding layers"),
    ({"sliding_window": None}, "sliding_window is None"),
])
def test_gemma3_unsupported_is_a_clear_error(extra, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf({**GEMMA3, **extra})


@pytest.mark.parametrize("fields, match", [
    (dict(rope_type="yarn"), "rope_type"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(layer_types=("full_attention",)), "layer_types has 1 entries"),
    (dict(layer_types=("local",) * 4), "layer_types entries"),
    (dict(hidden_act="relu"), "hidden_act"),
    (dict(num_experts=4, hidden_act="gelu_tanh"), "SwiGLU"),
])
def test_model_config_validates_the_new_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(num_layers=4, **fields)


def test_layer_types_from_json_stay_hashable():
    c = ModelConfig(num_layers=2, sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    assert c.layer_types == ("sliding_attention", "full_attention") and hash(c) is not None
