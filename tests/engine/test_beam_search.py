"""Engine beam search (forked beams sharing blocks) against an independent uncached beam search."""
import jax
import numpy as np
import pytest

from jaxserve import LLM, BeamSearchParams, SamplingParams
from jaxserve.models import get_preset, init_params
from tests.reference_forward import reference_logits

CONFIG = get_preset("tiny-llama").replace(vocab_size=11, max_position_embeddings=128, eos_token_id=10)
PARAMS = init_params(CONFIG, jax.random.key(3))
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 3, 2], [4] * 9]


@pytest.fixture(scope="module")
def llm():
    return LLM.from_params(CONFIG, PARAMS, block_size=4, max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=64)


def next_logprobs(tokens):
    return np.asarray(jax.nn.log_softmax(reference_logits(PARAMS, CONFIG, tokens)[0, -1]))


def reference_beam_search(prompt, width, max_tokens, length_penalty, ignore_eos):
    """vLLM's beam search rule, written directly over the uncached forward."""
    def score(tokens, cum, eos_ended):
        return cum / ((len(prompt) + len(tokens) - eos_ended) ** length_penalty)
    beams, completed = [([], 0.0)], []
    for _ in range(max_tokens):
        extended = []
        for tokens, cum in beams:
            lps = next_logprobs(prompt + tokens)
            for tok in np.argsort(-lps, kind="stable")[: 2 * width]:
                new = (tokens + [int(tok)], cum + float(lps[tok]))
                if tok == CONFIG.eos_token_id and not ignore_eos:
                    completed.append((*new, 1))
                else:
                    extended.append(new)
        beams = sorted(extended, key=lambda b: score(b[0], b[1], 0), reverse=True)[:width]
    pool = completed + [(t, c, 0) for t, c in beams]
    return sorted(pool, key=lambda b: score(*b), reverse=True)[:width]


def test_width_one_equals_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
    beams = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    assert [b.sequences[0].tokens for b in beams] == [g.outputs[0].token_ids for g in greedy]


@pytest.mark.parametrize("width, penalty, ignore_eos", [(3, 1.0, False), (4, 0.0, True)])
def test_matches_reference_beam_search(llm, width, penalty, ignore_eos):
    params = BeamSearchParams(beam_width=width, max_tokens=4, length_penalty=penalty, ignore_eos=ignore_eos)
    outs = llm.beam_search(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        expected = reference_beam_search(prompt, width, 4, penalty, ignore_eos)
        assert [b.tokens for b in out.sequences] == [t for t, _, _ in expected]
        np.testing.assert_allclose([b.cum_logprob for b in out.sequences], [c for _, c, _ in expected], atol=1e-4)
    assert llm.stats()["kv_blocks_used"] == 0 and not llm.engine.has_unfinished()


def test_beams_share_blocks():
    llm = LLM.from_params(CONFIG, PARAMS, block_size=4, max_num_seqs=8, max_num_batched_tokens=32,
                          num_kv_blocks=64, enable_prefix_caching=False)
    sched = llm.engine.scheduler
    peak = [0]
    original = sched.update

    def spy(*args, **kwargs):
        peak[0] = max(peak[0], llm.engine.block_manager.num_used)
        return original(*args, **kwargs)

    sched.update = spy
    llm.beam_search([[1] * 15], BeamSearchParams(beam_width=4, max_tokens=3, ignore_eos=True))
    # 4 independent 18-token beams would hold 4 * 5 = 20 blocks; forked beams share the 3 full
    # prompt blocks and own at most 2 each (the copied partial block and one new block)
    assert 0 < peak[0] <= 3 + 4 * 2
    assert llm.engine.block_manager.num_used == 0


def test_bad_beam_params():
    with pytest.raises(ValueError, match="beam_width must be >= 1"):
        BeamSearchParams(beam_width=0)
    llm = LLM.from_params(CONFIG, PARAMS, block_size=4, max_num_seqs=8, num_kv_blocks=16)
    with pytest.raises(ValueError, match="beam_width=9 exceeds the supported maximum 8"):
        llm.beam_search([[1, 2]], BeamSearchParams(beam_width=9))
