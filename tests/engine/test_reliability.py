"""Issue 25: no input poisons the engine, no request is lost, a failed call leaves no trace.

One test per numbered finding of the issue (the reproducer is the test), plus a hypothesis sweep
over SamplingParams and two threads sharing one LLM.
"""
import math
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from jaxserve import LLM, BeamSearchParams, SamplingParams
from jaxserve.config import EngineConfig
from jaxserve.models import get_preset, init_params

VOCAB = 97
CONFIG = get_preset("tiny-llama").replace(vocab_size=VOCAB, max_position_embeddings=48, eos_token_id=96)
PARAMS = init_params(CONFIG, jax.random.key(7))
ENGINE = dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=64)
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    llm = LLM.from_params(CONFIG, PARAMS, **ENGINE)
    llm.warmup()  # every bucket compiled once: the tests below only run steps
    return llm


def prompts(seed, n=3, lo=2, hi=10):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB - 1, int(k)).tolist() for k in rng.integers(lo, hi, n)]


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def assert_clean(llm):
    """Nothing of any call is left in the engine's bookkeeping."""
    e = llm.engine
    assert not e.has_unfinished() and not e.scheduler.seqs and not e.scheduler.waiting
    assert e.finished == {} and e._prompts == {} and not e._logprobs
    assert e.block_manager.num_used == 0


# ---- finding 1: NaN / inf temperature -------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e39])
def test_1_non_finite_temperature_is_rejected(llm, value):
    with pytest.raises(ValueError, match=r"SamplingParams\.temperature must be .*got "):
        SamplingParams(temperature=value)
    # and nothing reaches the engine: the batch's good prompt is not queued either
    with pytest.raises(ValueError, match=r"SamplingParams\.temperature"):
        llm.generate(prompts(1, 2), [GREEDY, SamplingParams(temperature=value)], use_tqdm=False)
    assert_clean(llm)


def test_1_nan_temperature_message_is_exact():
    with pytest.raises(ValueError) as e:
        SamplingParams(temperature=float("nan"))
    assert str(e.value) == "SamplingParams.temperature must be a finite number >= 0, got nan"


# ---- finding 2: values that used to wedge every later step ---------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(top_k=2**40), ValueError, r"SamplingParams\.top_k must be in \[0, 2\*\*31\), got 1099511627776"),
    (dict(n=2.5), TypeError, r"SamplingParams\.n must be an integer, got 2\.5 \(float\)"),
])
def test_2_overflowing_or_fractional_params_are_rejected(llm, kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)
    assert len(llm.generate(prompts(2, 1), GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 4
    assert_clean(llm)


def test_2_a_step_that_raises_aborts_its_call_and_the_next_call_runs(llm, monkeypatch):
    want = tokens(llm.generate(prompts(3), GREEDY, use_tqdm=False))
    real = llm.engine.runner.execute
    calls = []

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OverflowError("simulated device failure")
        return real(*a, **kw)

    monkeypatch.setattr(llm.engine.runner, "execute", failing)
    with pytest.raises(OverflowError):
        llm.generate(prompts(3), GREEDY, use_tqdm=False)
    assert_clean(llm)
    monkeypatch.setattr(llm.engine.runner, "execute", real)
    assert tokens(llm.generate(prompts(3), GREEDY, use_tqdm=False)) == want


# ---- finding 5: request ids, atomic calls, leaks -----------------------------------------------

def test_5_user_id_equal_to_a_generated_one_is_never_overwritten(llm):
    engine = llm.engine
    nxt = str(int(engine._new_id()) + 1)  # the id generate would assign next
    mine = engine.add_request(prompts(4, 1)[0], GREEDY, request_id=nxt)
    while engine.has_unfinished():
        engine.step()
    kept = engine.finished[mine]
    outs = llm.generate(prompts(5, 3), GREEDY, use_tqdm=False)
    assert nxt not in {o.request_id for o in outs}
    assert engine.finished.pop(mine) is kept and kept.prompt_token_ids == prompts(4, 1)[0]
    assert_clean(llm)


def test_5_duplicate_user_id_is_rejected_before_any_change(llm):
    engine = llm.engine
    engine.add_request([1, 2, 3], GREEDY, request_id="dup")
    before = llm.stats()
    with pytest.raises(ValueError, match="request id 'dup' is already in use"):
        engine.add_request([4, 5, 6], GREEDY, request_id="dup")
    assert llm.stats() == before and list(engine.scheduler.requests) == ["dup"]
    engine.abort("dup")
    with pytest.raises(ValueError, match="request id 'dup' is already in use"):  # its result is unclaimed
        engine.add_request([4, 5, 6], GREEDY, request_id="dup")
    engine.finished.pop("dup")
    assert_clean(llm)


def test_5_generate_with_one_bad_prompt_queues_nothing(llm):
    good = prompts(6, 3)
    with pytest.raises(ValueError, match=r"prompt 3: token id 97 is outside the vocabulary \[0, 97\)"):
        llm.generate(good + [[1, VOCAB]], GREEDY, use_tqdm=False)
    assert_clean(llm)


def test_5_beam_search_with_one_bad_prompt_queues_nothing_and_nothing_leaks(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    with pytest.raises(ValueError, match="prompt 1: empty prompt"):
        llm.beam_search([[1, 2, 3], []], params)
    assert_clean(llm)
    outs = llm.beam_search(prompts(7, 2), params)
    assert [len(o.sequences) for o in outs] == [2, 2]
    assert_clean(llm)
    llm.generate(prompts(7, 2), GREEDY, use_tqdm=False)
    assert_clean(llm)


# ---- finding 6: threads, KeyboardInterrupt --------------------------------------------------------

def test_6_two_threads_get_the_outputs_of_a_single_thread(llm):
    work = [(prompts(10 + t, 3), SamplingParams(max_tokens=4, temperature=0.8, seed=t, ignore_eos=True))
            for t in range(2)]
    want = [tokens(llm.generate(p, sp, use_tqdm=False)) for p, sp in work]
    got, errors = {}, []

    def run(t):
        try:
            got[t] = [tokens(llm.generate(*work[t], use_tqdm=False)) for _ in range(3)]
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert got == {t: [want[t]] * 3 for t in range(2)}
    assert_clean(llm)


def test_6_keyboard_interrupt_aborts_exactly_that_call(llm, monkeypatch):
    engine = llm.engine
    other = engine.add_request([5, 6, 7], GREEDY, request_id="other")  # not generate's: must survive
    real, calls = engine.step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real()

    monkeypatch.setattr(engine, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts(8), GREEDY, use_tqdm=False)
    assert list(engine.scheduler.requests) == [other] and set(engine._prompts) == {other}
    monkeypatch.setattr(engine, "step", real)
    outs = llm.generate(prompts(9, 2), GREEDY, use_tqdm=False)
    assert len(outs) == 2 and set(engine.finished) == {other}  # no piled-up results of the interrupted call
    engine.finished.pop(other)
    assert_clean(llm)


# ---- finding 7: a KV pool memory cannot hold --------------------------------------------------

def test_7_huge_num_kv_blocks_is_an_error_before_allocating():
    with pytest.raises(ValueError, match=r"num_kv_blocks: a KV pool of 1000000000 blocks x \d+ bytes = [\d,]+ bytes "
                                         r"does not fit in the [\d,]+ bytes available"):
        LLM.from_params(CONFIG, PARAMS, **{**ENGINE, "num_kv_blocks": 10**9})


class _FakeGpu:
    platform = "gpu"

    def memory_stats(self):
        return {"bytes_limit": 1000, "bytes_in_use": 400}


def test_7_device_memory_stats_bound_the_pool(monkeypatch):
    from jaxserve.engine import memory
    monkeypatch.setattr(memory.jax, "local_devices", lambda: [_FakeGpu(), _FakeGpu()])
    assert memory.available_bytes() == (1200, "free memory of 2 gpu device(s)")
    memory.check_kv_fits(12, 100)  # exactly fits
    with pytest.raises(ValueError, match=r"num_kv_blocks: a KV pool of 13 blocks x 100 bytes = 1,300 bytes does not "
                                         r"fit in the 1,200 bytes available \(free memory of 2 gpu device\(s\)\)"):
        memory.check_kv_fits(13, 100)


# ---- finding 8: silent coercions, unnamed fields, internal ids ---------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_tokens=2.5), TypeError, r"SamplingParams\.max_tokens must be an integer, got 2\.5"),
    (dict(seed=1.7), TypeError, r"SamplingParams\.seed must be an integer or None, got 1\.7"),
    (dict(top_k=2.5), TypeError, r"SamplingParams\.top_k must be an integer, got 2\.5"),
    (dict(max_tokens=True), TypeError, r"SamplingParams\.max_tokens must be an integer, got True \(bool\)"),
    (dict(stop_token_ids=[3.0]), TypeError, r"SamplingParams\.stop_token_ids: token 0 must be an integer id"),
    (dict(ignore_eos="yes"), TypeError, r"SamplingParams\.ignore_eos must be True or False, got 'yes'"),
    (dict(top_p=float("nan")), ValueError, r"SamplingParams\.top_p must be a finite number > 0 and <= 1, got nan"),
])
def test_8_sampling_params_are_not_coerced(kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(block_size=True), TypeError, r"EngineConfig\.block_size must be an integer, got True \(bool\)"),
    (dict(enable_prefix_caching="no"), TypeError, r"EngineConfig\.enable_prefix_caching must be True or False, got 'no'"),
    (dict(num_kv_blocks=64.0), TypeError, r"EngineConfig\.num_kv_blocks must be an integer or None, got 64\.0"),
    (dict(max_model_len=10**6), ValueError, r"EngineConfig\.max_model_len=1000000 exceeds the model's "
                                            r"max_position_embeddings=48"),
])
def test_8_engine_options_are_not_coerced_or_clamped(kwargs, error, message):
    with pytest.raises(error, match=message):
        LLM.from_params(CONFIG, PARAMS, **{**ENGINE, **kwargs})


def test_8_beam_search_params_are_strict():
    with pytest.raises(TypeError, match=r"BeamSearchParams\.beam_width must be an integer, got 2\.0"):
        BeamSearchParams(beam_width=2.0)
    with pytest.raises(ValueError, match=r"BeamSearchParams\.length_penalty must be a finite number, got inf"):
        BeamSearchParams(length_penalty=float("inf"))


@pytest.mark.parametrize("bad, error, message", [
    ([5.9, 6.2], TypeError, r"prompt 0: token 0 must be an integer id, got 5\.9 \(float\)"),
    (b"abc", TypeError, r"prompts must be .* got bytes"),
    ([[1, 2], b"abc"], TypeError, r"prompt 1 must be a list of token ids \(ints\), got bytes"),
    ([[1, 2], [True, 3]], TypeError, r"prompt 1: token 0 must be an integer id, got True \(bool\)"),
    ([[1, 2], [-1]], ValueError, r"prompt 1: token id -1 is outside the vocabulary"),
    ([[1, 2], "text"], ValueError, r"prompt 1: this model has no tokenizer"),
    ([[1, 2], [1] * 60], ValueError, r"prompt 1: prompt of 60 tokens is longer than max_model_len=48"),
])
def test_8_prompts_are_not_coerced_and_messages_name_the_prompt(llm, bad, error, message):
    with pytest.raises(error, match=message) as e:
        llm.generate(bad, GREEDY, use_tqdm=False)
    assert "_check" not in str(e.value)
    assert_clean(llm)


def test_8_numpy_integers_are_token_ids(llm):
    p = prompts(11, 1)[0]
    assert tokens(llm.generate(np.array(p), GREEDY, use_tqdm=False)) == tokens(llm.generate([p], GREEDY, use_tqdm=False))


def test_8_step_with_nothing_queued_is_empty_not_a_pool_error(llm):
    assert llm.engine.step() == []
    assert_clean(llm)


def test_nan_params_are_rejected_at_load_naming_the_leaf():
    params = jax.tree.map(lambda x: x, PARAMS)
    params["layers_1"]["mlp"]["up_proj"]["kernel"] = params["layers_1"]["mlp"]["up_proj"]["kernel"].at[3, 5].set(jnp.nan)
    with pytest.raises(ValueError, match=r"model params \['layers_1'\]\['mlp'\]\['up_proj'\]\['kernel'\] hold 1 NaN/inf"):
        LLM.from_params(CONFIG, params, **ENGINE)
    params["layers_1"]["mlp"]["up_proj"]["kernel"] = PARAMS["layers_1"]["mlp"]["up_proj"]["kernel"]
    params["embed"]["embedding"] = params["embed"]["embedding"].at[0, 0].set(jnp.inf)
    with pytest.raises(ValueError, match=r"model params \['embed'\]\['embedding'\] hold 1 NaN/inf"):
        LLM.from_params(CONFIG, params, **ENGINE)


# ---- SamplingParams with arbitrary values: a named error or a valid run ------------------------

FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "seed", "n", "stop_token_ids", "ignore_eos", "logprobs")
ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 12),
                st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 2), st.text(max_size=3),
                st.binary(max_size=3), st.lists(st.integers(-5, 200), max_size=3),
                st.lists(st.floats(0, 5), max_size=2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(st.sampled_from(FIELDS), ANY, min_size=1, max_size=3))
def test_sampling_params_fuzz_named_error_or_valid_run(llm, values):
    try:
        sp = SamplingParams(**values)
    except (TypeError, ValueError) as e:
        assert any(f"SamplingParams.{f}" in str(e) for f in values), str(e)
        return
    sp = SamplingParams(**{**values, "max_tokens": min(sp.max_tokens, 3)}) if sp.max_tokens > 3 else sp
    try:
        outs = llm.generate([[1, 2, 3]], sp, use_tqdm=False)
    except ValueError as e:
        assert "n=" in str(e) and "n" in values, str(e)  # more samples than seats
        assert_clean(llm)
        return
    assert len(outs[0].outputs) == sp.n
    for c in outs[0].outputs:
        assert 1 <= len(c.token_ids) <= sp.max_tokens and all(0 <= t < VOCAB for t in c.token_ids)
        if sp.logprobs:
            assert all(math.isfinite(lp) and lp <= 0 for lp in c.logprobs)
    assert_clean(llm)


def test_engine_config_rejects_wrong_types_directly():
    with pytest.raises(TypeError, match=r"EngineConfig\.seed must be an integer, got 1\.5"):
        EngineConfig(seed=1.5)
