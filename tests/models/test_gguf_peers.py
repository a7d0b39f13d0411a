"""SmolLM2-135M-Instruct from its GGUF file against Hugging Face transformers reading the same file (float32):
tokenizer ids on real text, prefill logits, greedy chat replies, perplexity; and GGUF files written by
``save_gguf`` read by transformers' own GGUF loader (its reverse of llama.cpp's Q/K permutation, not ours)."""
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from jaxserve import LLM, SamplingParams  # noqa: E402
from jaxserve.models import forward_full  # noqa: E402
from jaxserve.models.gguf import load_gguf  # noqa: E402
from jaxserve.models.gguf_export import save_gguf  # noqa: E402
from jaxserve.models.hf import load_hf  # noqa: E402
from tests.models.gguf_files import assert_greedy_matches, load_with_transformers, smollm2_path  # noqa: E402

# one worker loads the 135M model once for the whole module (pytest -n 2 --dist loadgroup)
pytestmark = [pytest.mark.peers, pytest.mark.xdist_group("smollm2-peers")]
REAL_TEXT = pathlib.Path(__file__).resolve().parents[1] / "data" / "real_text"
QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def smollm2():
    return load_with_transformers(smollm2_path())


def test_tokenizer_matches_transformers_on_real_text(smollm2):
    """Ids equal transformers' GGUF tokenizer wherever the text has no digits. transformers does not know
    llama.cpp's ``smollm`` pre-tokenizer (each digit split off first, as in SmolLM2's own tokenizer.json) and
    falls back to GPT-2's split, which differs around digits ("   1." -> "   ", " 1" there, "    ", "1" in
    llama.cpp); with that one split added to transformers' tokenizer, every line is equal."""
    import copy

    from tokenizers import pre_tokenizers
    _, _, tok, _, hf_tok = smollm2
    stock = hf_tok.backend_tokenizer
    digits = copy.deepcopy(stock)
    digits.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), stock.pre_tokenizer])
    lines = [line for f in sorted(REAL_TEXT.glob("*.txt")) for line in f.read_text().splitlines()]
    lines += ["<|im_start|>user\nCafé, naïve, 中文, emoji 🙂 and tabs\t\there<|im_end|>", "  leading spaces", "x = [1, 22, 333]"]
    assert len(lines) > 2000
    for line in lines:
        ids = tok.encode(line)
        assert ids == digits.encode(line, add_special_tokens=False).ids, line
        if not any(c.isdigit() for c in line):
            assert ids == stock.encode(line, add_special_tokens=False).ids, line
        assert tok.decode(ids, skip_special_tokens=False) == line
    text = "\n".join(lines[:300])  # and whole paragraphs, newlines included
    assert tok.encode(text) == digits.encode(text, add_special_tokens=False).ids


def _chat_ids(tok, question):
    return tok.encode_chat([{"role": "user", "content": question}])


def test_prefill_logits_match_transformers(smollm2):
    """Within 1.5e-4 of transformers run in float64 on the same weights, on average as close as transformers' own
    float32.

    Two float32 implementations of 30 layers differ from the float64 result by up to ~9e-5 each, in
    different directions (up to 1.2e-4 from each other on 0.005% of the logits), so the float64 run is the referee."""
    import copy
    config, params, tok, hf, _ = smollm2
    ids = _chat_ids(tok, QUESTIONS[0])
    with torch.no_grad():
        hf32 = hf(torch.tensor([ids])).logits.numpy()
        hf64 = copy.deepcopy(hf).double()(torch.tensor([ids])).logits.numpy()
    got = np.asarray(forward_full(params, config, jnp.asarray([ids])))
    # the worst logit within 1.5e-4 (logits of magnitude ~10-30): 1e-4 held on the AMD VMs, an Intel Xeon VM in 2026-12
    # gave one logit in 1.8M 1.04e-4 off (transformers' float32 6.0e-5) with either attention path; the mean below
    # is the sharper check
    np.testing.assert_allclose(got, hf64, atol=1.5e-4, rtol=0)
    np.testing.assert_allclose(got, hf32, atol=2e-4, rtol=0)
    # the mean error is of the order of transformers' own float32 (1.41x it on an AMD VM in 2026-12, 1.24x on an
    # Intel one, <= 1.25x before: XLA:CPU's dot kernels differ with the CPU features)
    assert np.abs(got - hf64).mean() < 1.5 * np.abs(hf32 - hf64).mean()


def test_greedy_chat_matches_transformers(smollm2):
    """One sequence at a time, prefilled in 32-token chunks: two step programs to compile (a 30-layer program takes
    XLA ~12 s under the tests' flags; a batch of 3 draining to 2 and 1 compiled four, and the prompts' shared
    system prompt, a prefix-cache hit, a third prefill size). Batched decoding is compared in tests/engine."""
    config, params, tok, hf, _ = smollm2
    llm = LLM.from_params(config, params, tok, max_num_seqs=1, max_num_batched_tokens=32)
    outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS],
                    SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)
    assert outs[0].outputs[0].text == "The capital of France is Paris."
    for q, out in zip(QUESTIONS, outs):
        assert_greedy_matches(hf, _chat_ids(tok, q), out.outputs[0].token_ids, eos=2, pad=2)


def test_perplexity_matches_transformers(smollm2):
    config, params, tok, hf, _ = smollm2
    ids = tok.encode((REAL_TEXT / "GFDL-1.3.txt").read_text())[:384]
    logits = np.asarray(forward_full(params, config, jnp.asarray([ids])))[0, :-1]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ours = float(np.exp(np.mean(logz - logits[np.arange(len(ids) - 1), ids[1:]])))
    with torch.no_grad():
        theirs = float(torch.exp(hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss))
    assert 1.0 < ours < 100.0  # a real model reading English, not noise
    assert abs(ours / theirs - 1) < 1e-3, (ours, theirs)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_transformers_reads_our_gguf_files(tmp_path, family):
    """A random HF model -> load_hf -> save_gguf -> transformers' GGUF loader gives the original's logits."""
    classes = {"llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
               "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config),
               "gemma3": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig)}
    cls, config_cls = classes[family]
    shape = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    if family == "qwen3":  # transformers' GGUF reader takes Qwen3's head_dim from its default (128)
        shape = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128)
    if family == "gemma3":  # 5 sliding layers then a full one (llama.cpp's fixed pattern); transformers' GGUF
        # reader takes query_pre_attn_scalar from its default (256), llama.cpp from head_dim: both 256 here
        shape = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                     query_pre_attn_scalar=256, sliding_window=8, num_hidden_layers=6)
    cfg = config_cls(**{**dict(vocab_size=320, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=128,
                               rope_theta=5000.0, rms_norm_eps=1e-5), **shape})
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    config, params = load_hf(tmp_path / "hf")
    path = save_gguf(tmp_path / "m.gguf", config, params)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                               torch_dtype=torch.float32).eval()
    tokens = np.random.default_rng(1).integers(0, 320, (1, 17))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
        np.testing.assert_allclose(theirs(torch.tensor(tokens)).logits.numpy(), expected, atol=1e-4, rtol=0)
    config2, params2 = load_gguf(path)
    for field in ("num_layers", "head_dim", "layer_types", "sliding_window", "rope_local_theta",
                  "query_pre_attn_scalar", "norm_unit_offset", "sandwich_norms", "hidden_act"):
        assert getattr(config2, field) == getattr(config, field), field
    np.testing.assert_allclose(np.asarray(forward_full(params2, config2, jnp.asarray(tokens))), expected, atol=1e-4)
