"""Multi-step decoding (``EngineConfig.num_scheduler_steps``): K decode steps in one program emit what K single
steps emit, cut where a request stops, and compile only the warm-up's programs."""
import jax
import numpy as np
import pytest

from jaxserve import LLM, BeamSearchParams, SamplingParams
from jaxserve.config import EngineConfig
from jaxserve.models import get_preset, init_params
from jaxserve.speculative.config import SpeculativeConfig

CONFIG = get_preset("tiny-llama").replace(vocab_size=97, max_position_embeddings=256, eos_token_id=96)
PARAMS = init_params(CONFIG, jax.random.key(7))
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=128)


def make_llm(**overrides):
    return LLM.from_params(CONFIG, PARAMS, **{**ENGINE, **overrides})


def workload(seed, n=10):
    """Prompts and params with every way a request ends early: lengths not a multiple of K, EOS, stop tokens."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 96, int(k)).tolist() for k in rng.integers(3, 30, n)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 15)), temperature=[0.0, 0.9][i % 2], top_k=[0, 20][i % 3 > 0],
                             seed=i, logprobs=True, ignore_eos=i % 4 == 0,
                             stop_token_ids=[int(t) for t in rng.integers(0, 96, i % 3)]) for i in range(n)]
    return prompts, params


def results(outs):
    return [[(c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


@pytest.mark.parametrize("steps", [2, 4])
def test_multi_step_emits_what_single_steps_emit(steps):
    prompts, params = workload(0)
    want = make_llm().generate(prompts, params, use_tqdm=False)
    llm = make_llm(num_scheduler_steps=steps)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert results(got) == results(want)
    for a, b in zip(got, want):  # (the batch buckets differ between the two: float32 sums in another order)
        np.testing.assert_allclose(a.outputs[0].logprobs, b.outputs[0].logprobs, atol=2e-5)
        assert len(a.outputs[0].logprobs) == len(a.outputs[0].token_ids)
    assert llm.stats()["kv_blocks_used"] == 0


def test_multi_step_under_memory_pressure_and_with_parallel_samples():
    """Preemption (lookahead slots are given up, never taken by preempting) and n > 1 forks keep the outputs."""
    prompts, _ = workload(1)
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=i, n=1 + i % 3, ignore_eos=True)
              for i in range(len(prompts))]
    want = make_llm().generate(prompts, params, use_tqdm=False)
    tight = make_llm(num_kv_blocks=20, max_num_batched_tokens=16, num_scheduler_steps=4)
    assert results(tight.generate(prompts, params, use_tqdm=False)) == results(want)
    assert tight.stats()["num_preemptions"] > 0


def test_a_lone_request_takes_one_engine_step_per_k_tokens():
    llm = make_llm(num_scheduler_steps=4)
    engine = llm.engine
    rid = engine.add_request(list(range(1, 10)), SamplingParams(max_tokens=14, temperature=0, ignore_eos=True))
    per_step = []
    while engine.has_unfinished():
        per_step.append(len(engine.step()))
    assert per_step == [1, 4, 4, 4, 1]  # prefill's token, then 13 in steps of up to 4
    alone = make_llm().generate([list(range(1, 10))], SamplingParams(max_tokens=14, temperature=0, ignore_eos=True),
                                use_tqdm=False)[0]
    assert engine.finished.pop(rid).outputs[0].token_ids == alone.outputs[0].token_ids


def test_compiles_nothing_after_warm_up():
    llm = make_llm(num_scheduler_steps=4)
    warm = llm.warmup()
    assert warm == llm.stats()["compilations"] <= llm.stats()["buckets"]
    prompts, params = workload(2, n=24)
    llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["compilations"] == warm


def test_beam_search_runs_single_steps():
    """Beam search reads each step's top candidates: a multi-step engine runs it one token a step, as before."""
    bp = BeamSearchParams(beam_width=3, max_tokens=6)
    prompt = [[5, 6, 7, 8]]
    want = make_llm().beam_search(prompt, bp)
    got = make_llm(num_scheduler_steps=4).beam_search(prompt, bp)
    assert [[(s.tokens, s.cum_logprob) for s in o.sequences] for o in got] == \
        [[(s.tokens, s.cum_logprob) for s in o.sequences] for o in want]


def test_bad_num_scheduler_steps():
    with pytest.raises(ValueError, match="EngineConfig.num_scheduler_steps must be > 0, got 0"):
        EngineConfig(num_scheduler_steps=0)
    with pytest.raises(TypeError, match="EngineConfig.num_scheduler_steps"):
        EngineConfig(num_scheduler_steps=2.0)
    with pytest.raises(ValueError, match="num_scheduler_steps=4 cannot be combined with speculative decoding"):
        make_llm(num_scheduler_steps=4, speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3))
