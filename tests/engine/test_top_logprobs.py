"""``SamplingParams.top_logprobs``: each position's most likely tokens and log-probs, against log_softmax of an
independent uncached forward over prompt + outputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams, SpeculativeConfig
from jaxserve.models import get_preset, init_params
from jaxserve.sampling_params import MAX_TOP_LOGPROBS
from tests.reference_forward import reference_logits

CONFIG = get_preset("tiny-llama").replace(vocab_size=96, max_position_embeddings=128, eos_token_id=1)
PARAMS = init_params(CONFIG, jax.random.key(5))
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=96)


@pytest.fixture(scope="module")
def llm():
    return LLM.from_params(CONFIG, PARAMS, **ENGINE)


def _reference(prompt, generated):
    """log_softmax of the uncached forward: row i is the distribution of output token i."""
    logits = reference_logits(PARAMS, CONFIG, prompt + generated)[0, len(prompt) - 1:-1]
    return np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))


@pytest.mark.parametrize("k, sampling", [(1, dict(temperature=0)), (5, dict(temperature=0)),
                                         (MAX_TOP_LOGPROBS, dict(temperature=1.0, seed=3, n=2))])
def test_top_logprobs_are_the_models_most_likely_tokens(llm, k, sampling):
    rng = np.random.default_rng(k)
    prompts = [rng.integers(2, 96, int(n)).tolist() for n in (5, 19, 33)]  # prefill chunks and decodes mixed
    sp = SamplingParams(max_tokens=7, ignore_eos=True, logprobs=True, top_logprobs=k, **sampling)
    plain = llm.generate(prompts, SamplingParams(max_tokens=7, ignore_eos=True, logprobs=True, **sampling),
                         use_tqdm=False)
    for prompt, out, ref_out in zip(prompts, llm.generate(prompts, sp, use_tqdm=False), plain):
        for o, ref_o in zip(out.outputs, ref_out.outputs):
            assert o.token_ids == ref_o.token_ids and ref_o.top_logprobs is None  # asking changes no token
            ref = _reference(prompt, o.token_ids)
            assert len(o.top_logprobs) == len(o.token_ids)
            for row, pos in zip(ref, o.top_logprobs):
                ids, lps = [t for t, _ in pos], [lp for _, lp in pos]
                assert len(pos) == k and lps == sorted(lps, reverse=True)
                np.testing.assert_allclose(lps, np.sort(row)[::-1][:k], atol=1e-5)
                np.testing.assert_allclose(row[ids], lps, atol=1e-5)  # each id carries its own log-prob
            if sampling["temperature"] == 0:  # greedy: the chosen token is the top candidate
                assert [pos[0][0] for pos in o.top_logprobs] == o.token_ids
                np.testing.assert_allclose([pos[0][1] for pos in o.top_logprobs], o.logprobs, atol=1e-6)
    if sampling.get("n", 1) > 1:  # both samples' first token came from the prompt's logits
        assert out.outputs[0].top_logprobs[0] == out.outputs[1].top_logprobs[0]


def test_streamed_step_tokens_carry_the_same_top_logprobs(llm):
    engine = llm.engine
    sp = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)
    rid = engine.add_request([5, 6, 7, 8], sp)
    streamed = []
    while engine.has_unfinished():
        streamed += [t.top_logprobs for t in engine.step() if t.request_id == rid]
    assert [list(t) for t in streamed] == engine.finished.pop(rid).outputs[0].top_logprobs
    assert len(streamed) == 5


@pytest.mark.parametrize("kw, error, words", [
    (dict(top_logprobs=2), ValueError, "top_logprobs=2 needs logprobs=True"),
    (dict(logprobs=True, top_logprobs=MAX_TOP_LOGPROBS + 1), ValueError, "SamplingParams.top_logprobs must be"),
    (dict(logprobs=True, top_logprobs=-1), ValueError, "SamplingParams.top_logprobs must be"),
    (dict(logprobs=True, top_logprobs=2.0), TypeError, "SamplingParams.top_logprobs must be an integer")])
def test_bad_top_logprobs(kw, error, words):
    with pytest.raises(error, match=words):
        SamplingParams(**kw)


def test_top_logprobs_refused_with_speculative_decoding():
    llm = LLM.from_params(CONFIG, PARAMS, speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=2),
                          **ENGINE)
    with pytest.raises(ValueError, match="top_logprobs=2 is not available with speculative decoding"):
        llm.generate([[3, 4, 5]], SamplingParams(max_tokens=3, logprobs=True, top_logprobs=2), use_tqdm=False)
    assert not llm.engine.has_unfinished()
