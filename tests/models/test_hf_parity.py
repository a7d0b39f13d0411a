"""Logits parity with Hugging Face transformers on tiny random models (float32)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


from jaxserve.models import load_hf  # noqa: E402
from tests.reference_forward import reference_logits  # noqa: E402

pytestmark = pytest.mark.peers

FAMILIES = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, {}),
    "llama_bias": (transformers.LlamaForCausalLM, transformers.LlamaConfig, {"attention_bias": True}),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, {}),
    "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, {"head_dim": 24}),
}
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}


def make_hf_model(family, kv, tied, seed=0):
    cls, config_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=KV_HEADS[kv], max_position_embeddings=128,
                        tie_word_embeddings=tied, rope_theta=5000.0, **extra)
    model = cls(config).eval()
    with torch.no_grad():  # HF zero-inits biases and ones-inits norms: randomise so they are tested
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kv", list(KV_HEADS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(tmp_path, family, kv, tied):
    model = make_hf_model(family, kv, tied)
    model.save_pretrained(tmp_path)
    config, params = load_hf(tmp_path)
    assert config.num_kv_heads == KV_HEADS[kv] and config.tie_word_embeddings == tied
    tokens = np.random.default_rng(1).integers(0, 97, (2, 21))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    got = reference_logits(params, config, tokens)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    model = make_hf_model("llama", "gqa", False)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    config, params = load_hf(tmp_path)
    tokens = np.arange(10)[None]
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(reference_logits(params, config, tokens), expected, atol=1e-4)
