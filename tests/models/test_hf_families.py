"""Llama 3.x (scaled RoPE), Mistral (with and without a sliding window) and Gemma 3 text against
Hugging Face transformers on tiny random models (float32): prefill logits through the paged pool and
greedy tokens through the engine, the fresh-prefill generate loop and every attention implementation.

Windows (8 tokens) are shorter than the prompts (up to 30), and pages (4 tokens) shorter than the
window, so every path has to drop keys that slid out of it.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxserve import LLM, SamplingParams  # noqa: E402
from jaxserve.models.attention_backends import new_kv_pool  # noqa: E402
from jaxserve.models import AttentionMetadata, forward, load_hf  # noqa: E402
from jaxserve.speculative.generate import target_only_generate  # noqa: E402
from tests.reference_forward import reference_logits  # noqa: E402

pytestmark = pytest.mark.peers

VOCAB, WINDOW, BLOCK, NEW_TOKENS = 256, 8, 4, 16
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
GEMMA3 = dict(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW, sliding_window_pattern=2,
              query_pre_attn_scalar=24, rope_theta=1e6, rope_local_base_freq=100.0)
FAMILIES = {  # name: (model class, config class, config kwargs, what load_hf must make of them)
    "llama3": (transformers.LlamaForCausalLM, transformers.LlamaConfig,
               dict(rope_theta=500000.0, rope_scaling=LLAMA3_ROPE), dict(rope_type="llama3", rope_factor=8.0)),
    "llama-linear": (transformers.LlamaForCausalLM, transformers.LlamaConfig,
                     dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), dict(rope_type="linear")),
    "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig, dict(sliding_window=None),
                dict(sliding_window=None)),
    "mistral-window": (transformers.MistralForCausalLM, transformers.MistralConfig, dict(sliding_window=WINDOW),
                       dict(sliding_window=WINDOW, layer_types=())),
    "gemma3": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig, GEMMA3,
               dict(sliding_window=WINDOW, rope_local_theta=100.0, tie_word_embeddings=True,
                    layer_types=("sliding_attention", "full_attention") * 2)),
    "gemma3-softcap": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig,
                       dict(GEMMA3, final_logit_softcapping=0.5, tie_word_embeddings=False),
                       dict(final_logit_softcap=0.5, tie_word_embeddings=False)),
}
WINDOWED = ["mistral-window", "gemma3"]
# one engine-level case per family: the variants without a window (Mistral's is Llama's graph) or whose
# extra feature (linear RoPE, a logit cap) acts in the model only are covered by the logits tests
ENGINE_FAMILIES = ["llama3", "mistral-window", "gemma3"]


def _hf_model(family, seed=0):
    cls, config_cls, extra, _ = FAMILIES[family]
    torch.manual_seed(seed)
    kw = dict(dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1), **extra)
    model = cls(config_cls(**kw)).eval()
    with torch.no_grad():  # HF inits norms to ones (Gemma: zeros, scaling by 1 + w): randomise them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, HF model, jaxserve config, params) loaded from the saved HF directory."""
    model = _hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    config, params = load_hf(path)
    for field, value in FAMILIES[request.param][3].items():
        assert getattr(config, field) == value, field
    return request.param, model, config, params


def _prompts(lengths=(30, 13), seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, n).tolist() for n in lengths]


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


def _hf_greedy(model, prompt, n=NEW_TOKENS):
    """HF's greedy continuation and, per step, the gap between its two best logits."""
    tokens, gaps = list(prompt), []
    for _ in range(n):
        logits = _hf_logits(model, tokens)[-1]
        top2 = np.sort(logits)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt):], gaps


def _assert_greedy_equal(got, want, gaps, tie=1e-4):
    """Token for token, except that a divergence right after a near-tie of HF's top two logits ends the check."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            assert gaps[i] < tie, f"token {i}: {a} != HF's {b} (HF's top-2 gap {gaps[i]:.2e}); got {got}, HF {want}"
            return
    assert len(got) == len(want)


def test_full_forward_logits_match(family):
    name, model, config, params = family
    tokens = _prompts()[0]
    got = reference_logits(params, config, [tokens])[0]
    np.testing.assert_allclose(got, _hf_logits(model, tokens), atol=1e-4, rtol=0)


def test_config_features_change_the_logits(family):
    """The feature each family adds is live here: without it the logits would be off."""
    name, model, config, params = family
    plain = {"llama3": dict(rope_type="default"), "llama-linear": dict(rope_type="default"),
             "mistral": None, "mistral-window": dict(sliding_window=None),
             "gemma3": dict(sliding_window=None, layer_types=()), "gemma3-softcap": dict(final_logit_softcap=None)}
    if plain[name] is None:
        pytest.skip("no extra feature")
    tokens = jnp.asarray([_prompts()[0]])
    diff = reference_logits(params, config, tokens) - reference_logits(params, config.replace(**plain[name]), tokens)
    assert float(jnp.max(jnp.abs(diff))) > 1e-2


def _step_inputs(tables, seqs, starts, num_tokens, decode_only=False):
    """tokens, positions i32[num_tokens] and metadata for the new tokens ``seqs[b]`` of each sequence
    from position ``starts[b]``, padded to ``num_tokens`` rows (padding writes nowhere)."""
    tokens, pos, slots, cu = [], [], [], [0]
    for table, seq, start in zip(tables, seqs, starts):
        tokens += seq
        pos += range(start, start + len(seq))
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + len(seq))]
        cu.append(cu[-1] + len(seq))
    pad = num_tokens - len(tokens)
    meta = AttentionMetadata(slot_mapping=jnp.array(slots + [-1] * pad, jnp.int32),
                             block_tables=jnp.array(tables, jnp.int32),
                             context_lens=jnp.array([s + len(q) for s, q in zip(starts, seqs)], jnp.int32),
                             cu_q_lens=jnp.array(cu, jnp.int32), decode_only=decode_only)
    return jnp.array(tokens + [0] * pad, jnp.int32), jnp.array(pos + [0] * pad, jnp.int32), meta


def test_paged_prefill_and_decode_logits_match(family):
    """Chunked prefill of two packed prompts (11-token chunks, one padded 22-row step shape), then 3
    decode steps, through the paged pool (the XLA path); every position's logits against HF."""
    name, model, config, params = family
    prompts = _prompts()
    full = [p + _prompts((3,), seed=2)[0] for p in prompts]
    tables = np.random.default_rng(0).permutation(24)[:20].reshape(2, 10).tolist()
    pool = new_kv_pool(config, 24, BLOCK, "xla")
    step = jax.jit(lambda p, t, pos, pool, meta: forward(p, config, t, pos, pool, meta, attention_impl="xla"))
    got = [[], []]
    for lo in range(0, max(map(len, prompts)), 11):
        chunks = [p[lo:lo + 11] for p in prompts]
        tokens, positions, meta = _step_inputs(tables, chunks, [min(lo, len(p)) for p in prompts], 22)
        logits, pool = step(params, tokens, positions, pool, meta)
        at = np.cumsum([0] + [len(c) for c in chunks])
        for b in range(2):
            got[b].append(np.asarray(logits[at[b]:at[b + 1]]))
    for i in range(3):
        pos = [len(p) + i for p in prompts]
        tokens, positions, meta = _step_inputs(tables, [[f[q]] for f, q in zip(full, pos)], pos, 2, decode_only=True)
        logits, pool = step(params, tokens, positions, pool, meta)
        for b in range(2):
            got[b].append(np.asarray(logits[b:b + 1]))
    for b in range(2):
        np.testing.assert_allclose(np.concatenate(got[b]), _hf_logits(model, full[b]), atol=1e-4, rtol=0)


def _engine_family(family):
    if family[0] not in ENGINE_FAMILIES:
        pytest.skip("one engine-level case per family (ENGINE_FAMILIES); the logits tests cover this one")
    return family


def test_engine_greedy_matches(family):
    """The engine (chunked prefill: 16-token steps; 4-token pages; prefix caching on) against HF greedy."""
    name, model, config, params = _engine_family(family)
    prompts = _prompts()
    llm = LLM.from_params(config, params, block_size=BLOCK, max_num_seqs=2, max_num_batched_tokens=16,
                          num_kv_blocks=32, attention_impl="xla")
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        _assert_greedy_equal(out.outputs[0].token_ids, *_hf_greedy(model, prompt))


def test_fresh_prefill_generate_matches(family):
    """``target_only_generate``: the whole prompt in one fresh step (``causal_attention``), then decode."""
    name, model, config, params = _engine_family(family)
    prompts = _prompts()
    padded = np.zeros((2, 32), np.int32)
    for b, p in enumerate(prompts):
        padded[b, :len(p)] = p
    tokens, n, _ = target_only_generate(params, config, padded, np.array([len(p) for p in prompts]),
                                        max_tokens=NEW_TOKENS, block_size=BLOCK, attention_impl="xla")
    for b, prompt in enumerate(prompts):
        assert int(n[b]) == NEW_TOKENS
        _assert_greedy_equal(np.asarray(tokens[b]).tolist(), *_hf_greedy(model, prompt))


@pytest.mark.parametrize("impl", ["reference", "pallas"])
@pytest.mark.parametrize("name", WINDOWED)
def test_windowed_engine_greedy_every_impl(tmp_path, name, impl):
    """The sliding-window families through the reference and the (interpreted) Pallas kernels."""
    model = _hf_model(name)
    path = tmp_path / name
    model.save_pretrained(path)
    config, params = load_hf(path)
    prompt = _prompts((21,))[0]
    llm = LLM.from_params(config, params, block_size=BLOCK, max_num_seqs=1, max_num_batched_tokens=16,
                          num_kv_blocks=16, attention_impl=impl)
    out = llm.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True),
                       use_tqdm=False)
    _assert_greedy_equal(out[0].outputs[0].token_ids, *_hf_greedy(model, prompt))
