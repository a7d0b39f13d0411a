"""Engine behaviour on a tiny random model: memory pressure, prefix caching, n>1, seeds, errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.models import get_preset, init_params
from tests.reference_forward import reference_logits

CONFIG = get_preset("tiny-llama").replace(vocab_size=97, max_position_embeddings=256, eos_token_id=96)
PARAMS = init_params(CONFIG, jax.random.key(7))
ENGINE = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=32)


def make_llm(**overrides):
    return LLM.from_params(CONFIG, PARAMS, **{**ENGINE, "num_kv_blocks": 128, **overrides})


@pytest.fixture(scope="module")
def llm():
    return make_llm()


def prompts(seed, n=8, lo=3, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 96, int(k)).tolist() for k in rng.integers(lo, hi, n)]


GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_memory_pressure_preempts_and_gives_identical_outputs(llm):
    ps = prompts(1, n=10)
    big = llm.generate(ps, GREEDY, use_tqdm=False)
    small = make_llm(num_kv_blocks=16, max_num_batched_tokens=16)
    tight = small.generate(ps, GREEDY, use_tqdm=False)
    stats = small.stats()
    assert stats["num_preemptions"] > 0  # the pool really was too small
    assert tokens(tight) == tokens(big)
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("cap", [1, 8])  # 1: one chunk per step; 8 (= the seats): never binding
def test_partial_prefill_cap_gives_identical_outputs(llm, cap):
    """The XLA path runs single-token rows through its decode body when the cap is set; the logprobs
    match the all-tiles path's (the cap's default is 8, so ``llm`` itself runs with it)."""
    ps = prompts(4, n=8)
    sp = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)
    want = llm.generate(ps, sp, use_tqdm=False)
    got = make_llm(max_num_partial_prefills=cap, attention_impl="reference").generate(ps, sp, use_tqdm=False)
    assert tokens(got) == tokens(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.outputs[0].logprobs, b.outputs[0].logprobs, atol=2e-5)


def test_runner_rejects_steps_over_the_partial_prefill_cap(llm):
    from jaxserve.engine.batching import pack
    from jaxserve.engine.scheduler import ScheduledSequence
    chunks = [ScheduledSequence(seq_id=i, request_id=str(i), index=0, token_ids=[1, 2], start_pos=0, block_table=[i],
                                slot_mapping=[4 * i, 4 * i + 1], sample=False, num_samples=0, sampling_params=None)
              for i in range(9)]
    with pytest.raises(RuntimeError, match="9 sequences with more than one token .* max_num_partial_prefills=8"):
        llm.engine.runner._metadata(pack(chunks, 32, 16, 4))  # 9 > max_num_seqs: only a bypassing caller gets here


def test_greedy_equals_uncached_forward(llm):
    ps = prompts(2, n=3)
    outs = llm.generate(ps, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True),
                        use_tqdm=False)
    for p, out in zip(ps, outs):
        generated = out.outputs[0].token_ids
        # one uncached pass over prompt + outputs: position i's logits predict token i + 1
        logits = reference_logits(PARAMS, CONFIG, p + generated)[0, len(p) - 1:-1]
        np.testing.assert_array_equal(generated, np.argmax(logits, axis=-1))
        expected_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.array(generated)[:, None], 1)
        np.testing.assert_allclose(out.outputs[0].logprobs, expected_lp[:, 0], atol=1e-5)


def test_logprobs_only_where_a_request_asks(llm):
    """A step computes its tokens' log-probs only when a request in it asks (vLLM's rule): asking changes no
    token, an asking request gets the same log-probs beside requests that do not, and steps where nobody asks
    stream tokens without one."""
    ps = prompts(5, n=4)
    asks = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True)
    silent = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    every = llm.generate(ps, asks, use_tqdm=False)
    mixed = llm.generate(ps, [asks] + [silent] * 3, use_tqdm=False)
    assert tokens(mixed) == tokens(every) == tokens(llm.generate(ps, silent, use_tqdm=False))
    np.testing.assert_array_equal(mixed[0].outputs[0].logprobs, every[0].outputs[0].logprobs)
    assert all(o.outputs[0].logprobs is None and o.outputs[0].cumulative_logprob is None for o in mixed[1:])
    alone = llm.generate(ps[:1], asks, use_tqdm=False)[0].outputs[0].logprobs  # the batch shape streamed below
    engine = llm.engine
    for sp in (silent, asks):
        engine.add_request(ps[0], sp)
        streamed = []
        while engine.has_unfinished():
            streamed += engine.step()
        assert len(streamed) == 6
        if sp.logprobs:
            np.testing.assert_array_equal([t.logprob for t in streamed], alone)
        else:
            assert all(t.logprob is None for t in streamed)


def test_prefix_caching_on_off_identical_and_hits():
    shared = prompts(3, n=1, lo=24, hi=25)[0]
    ps = [shared + [i, i + 1] for i in range(6)]
    on, off = make_llm(enable_prefix_caching=True), make_llm(enable_prefix_caching=False)
    out_on = on.generate(ps[:1], GREEDY, use_tqdm=False) + on.generate(ps[1:], GREEDY, use_tqdm=False)
    out_off = off.generate(ps, GREEDY, use_tqdm=False)
    assert tokens(out_on) == tokens(out_off)
    assert on.stats()["prefix_cache_hit_rate"] > 0.5
    assert off.stats()["prefix_cache_hit_rate"] == 0


def peak_blocks(llm, ps, sp):
    engine = llm.engine
    for p in ps:
        engine.add_request(p, sp)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.block_manager.num_used)
    return peak


def test_parallel_samples_share_prompt_blocks():
    prompt = prompts(4, n=1, lo=30, hi=31)[0]
    sp = SamplingParams(max_tokens=3, temperature=1.0, seed=0, ignore_eos=True)
    shared = peak_blocks(make_llm(enable_prefix_caching=False), [prompt], SamplingParams(**{**vars(sp), "n": 4}))
    separate = peak_blocks(make_llm(enable_prefix_caching=False), [prompt] * 4, sp)
    assert shared < separate


def test_n_samples_are_distinct_and_reproducible(llm):
    sp = SamplingParams(max_tokens=8, temperature=1.0, seed=5, n=4, ignore_eos=True)
    a = llm.generate([prompts(5, 1)[0]], sp, use_tqdm=False)[0]
    b = llm.generate([prompts(5, 1)[0]], sp, use_tqdm=False)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2, 3]
    assert tokens([a]) == tokens([b])
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1


def test_seeded_output_independent_of_batch(llm):
    target = prompts(6, 1)[0]
    sp = SamplingParams(max_tokens=10, temperature=0.9, top_k=20, top_p=0.9, seed=1234, ignore_eos=True)
    alone = llm.generate([target], sp, use_tqdm=False)[0]
    others = prompts(7, n=5)
    mixed = llm.generate(others[:2] + [target] + others[2:],
                         [SamplingParams(max_tokens=7, temperature=1.0)] * 2 + [sp] + [GREEDY] * 3,
                         use_tqdm=False)[2]
    assert alone.outputs[0].token_ids == mixed.outputs[0].token_ids


def test_stop_tokens_and_max_tokens(llm):
    p = prompts(8, 1)[0]
    free = llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0]
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    out = llm.generate([p], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_at]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.token_ids[: first + 1] and out.finish_reason == "stop"
    assert out.stop_reason == stop_at
    assert free.finish_reason == "length" and len(free.token_ids) == 12


@pytest.mark.parametrize("prompt, params, message", [
    ([], GREEDY, "empty prompt"),
    ([1] * 300, GREEDY, "longer than max_model_len"),
    ([1, 97], GREEDY, "token id 97 is outside the vocabulary"),
    ("text", GREEDY, "no tokenizer"),
])
def test_bad_requests_raise_before_state_changes(llm, prompt, params, message):
    before = llm.stats()
    with pytest.raises(ValueError, match=message):
        llm.generate([[1, 2, 3], prompt], params, use_tqdm=False)
    assert llm.stats() == before and not llm.engine.has_unfinished()
    assert len(llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 12


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, r"SamplingParams\.n must be >= 1, got 0"),
    ({"temperature": -1}, r"SamplingParams\.temperature must be a finite number >= 0, got -1"),
    ({"top_p": 0}, r"SamplingParams\.top_p must be a finite number > 0 and <= 1, got 0"),
    ({"top_p": 1.5}, r"SamplingParams\.top_p must be a finite number > 0 and <= 1, got 1\.5"),
    ({"top_k": -1}, r"SamplingParams\.top_k must be in \[0, 2\*\*31\), got -1"),
    ({"max_tokens": 0}, r"SamplingParams\.max_tokens must be >= 1, got 0"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_abort_frees_blocks_and_others_continue(llm):
    engine = llm.engine
    keep = engine.add_request(prompts(9, 1)[0], GREEDY)
    drop = engine.add_request(prompts(10, 1)[0], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.block_manager.num_used > 0
    aborted = engine.abort(drop)
    assert aborted.outputs[0].finish_reason == "abort"
    with pytest.raises(ValueError, match="unknown request id 'nope'"):
        engine.abort("nope")
    while engine.has_unfinished():
        engine.step()
    assert len(engine.finished.pop(keep).outputs[0].token_ids) == 12
    assert engine.block_manager.num_used == 0


def test_unknown_engine_option():
    with pytest.raises(ValueError, match=r"unknown LLM option\(s\) \['block_sise'\]"):
        LLM.from_params(CONFIG, PARAMS, block_sise=8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_cache_bytes_counts_the_pool_as_stored(dtype):
    """The KV budget buys as many blocks as fit in the pool's storage dtype: on XLA:CPU a bf16 model's pool is
    float32 (no 16-bit gather there) unless the C++ attention kernel reads it (then bf16: twice the blocks), and
    its pool really is that size."""
    from jaxserve.kernels.cpu import attention as cpu_attention
    config = CONFIG.replace(dtype=dtype)
    params = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), PARAMS)
    block = 2 * config.num_layers * ENGINE["block_size"] * config.num_kv_heads * config.head_dim
    budget = 100 * block * 4 + 3  # 100 float32 blocks and change
    llm = LLM.from_params(config, params, **ENGINE, kv_cache_bytes=budget)
    on_cpu, kernel = jax.default_backend() == "cpu", cpu_attention.available()
    stored = 4 if on_cpu and not kernel else jnp.dtype(dtype).itemsize
    assert llm.stats()["kv_blocks_total"] == budget // (block * stored)
    pool = llm.engine.runner.pool
    assert sum(x.nbytes for x in jax.tree.leaves(pool)) <= budget


def test_reset_prefix_cache_makes_a_rerun_prefill_again():
    llm = make_llm(enable_prefix_caching=True)
    ps = prompts(6, n=3, lo=20, hi=30)
    first = llm.generate(ps, GREEDY, use_tqdm=False)
    hit_tokens = lambda: llm.engine.block_manager.stats().prefix_hit_tokens  # noqa: E731
    hits = hit_tokens()
    assert tokens(llm.generate(ps, GREEDY, use_tqdm=False)) == tokens(first)
    assert hit_tokens() > hits  # the rerun reused the cached prompts
    hits = hit_tokens()
    assert llm.reset_prefix_cache()
    assert tokens(llm.generate(ps, GREEDY, use_tqdm=False)) == tokens(first)
    assert hit_tokens() == hits  # nothing cached: every prompt prefilled again
    llm.engine.add_request(ps[0], GREEDY)
    assert not llm.reset_prefix_cache()  # a request in flight: refused
    while llm.engine.has_unfinished():
        llm.engine.step()
