"""Tiny random HF models saved to disk, loaded by jaxserve through the public LLM API.

torch and transformers (the peers extra) are imported by the fixture, not here: without them
tests/engine still collects, and the tests that use ``hf_dirs`` (marked ``peers``) skip.
"""
import pytest

VOCAB = 101


def _hf_model(kind: str, seed: int):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=VOCAB - 1, bos_token_id=0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common)).eval()


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """{'llama': (path, torch model), 'qwen3': (...)}: the same weights for HF and jaxserve."""
    out = {}
    for i, kind in enumerate(["llama", "qwen3"]):
        model = _hf_model(kind, seed=10 + i)
        path = tmp_path_factory.mktemp(kind)
        model.save_pretrained(path)
        out[kind] = (str(path), model)
    return out
