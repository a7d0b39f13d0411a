"""Scheduler tests, driven by a fake device whose "model" reads its context through the pool."""
import random

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from host_fakes import FakeDevice, Params, make_scheduler, next_token, run_to_completion
from jaxserve.engine.sequence import Request, Sequence, SequenceStatus


def random_workload(seed, num_requests=12, vocab=50, max_prompt=30, with_n=True):
    rng = random.Random(seed)
    shared = [rng.randrange(1, vocab) for _ in range(12)]  # a common prefix for cache hits
    reqs = []
    for i in range(num_requests):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(1, max_prompt))]
        if rng.random() < 0.4:
            prompt = shared + prompt
        params = Params(max_tokens=rng.randint(1, 16), n=rng.choice([1, 1, 2, 3]) if with_n else 1,
                        stop_token_ids=(rng.randrange(vocab),) if rng.random() < 0.3 else (),
                        ignore_eos=rng.random() < 0.3)
        reqs.append((f"r{i}", prompt, params))
    return reqs


def test_chunked_prefill_splits_and_runs_beside_decode():
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=8)
    dev = FakeDevice(32, 4)
    sched.add_request("short", [1, 2, 3], Params(max_tokens=10))
    out = sched.schedule()
    sched.update(out, dev.step(out))
    sched.add_request("long", list(range(1, 21)), Params(max_tokens=2))
    steps = []
    for _ in range(3):
        out = sched.schedule()
        steps.append([(e.request_id, e.start_pos, len(e.token_ids), e.sample) for e in out.scheduled])
        assert out.num_batched_tokens <= 8
        sched.update(out, dev.step(out))
    # The decode takes one token; the 20-token prompt fills the rest of each 8-token budget.
    assert steps == [[("short", 3, 1, True), ("long", 0, 7, False)],
                     [("short", 4, 1, True), ("long", 7, 7, False)],
                     [("short", 5, 1, True), ("long", 14, 6, True)]]


def test_steps_respect_budget_seats_and_slot_layout():
    sched = make_scheduler(num_blocks=20, max_num_seqs=5, max_num_batched_tokens=16)
    bs = sched.bm.block_size

    def check(out, res):
        assert out.num_batched_tokens == sum(len(e.token_ids) for e in out.scheduled) <= 16
        assert len(out.scheduled) <= 5 and len({e.seq_id for e in out.scheduled}) == len(out.scheduled)
        for e in out.scheduled:
            assert len(e.block_table) * bs >= e.context_len
            assert e.slot_mapping == [e.block_table[p // bs] * bs + p % bs
                                      for p in range(e.start_pos, e.context_len)]
    run_to_completion(sched, random_workload(1), on_step=check)
    assert sched.bm.num_used == 0


@pytest.mark.parametrize("cap", [1, 2])
def test_partial_prefill_cap_bounds_chunks_per_step_and_changes_no_output(cap):
    reqs = random_workload(3)

    def run(**kw):
        chunks_per_step = []
        sched = make_scheduler(num_blocks=400, max_num_seqs=16, max_num_batched_tokens=64, **kw)
        got = run_to_completion(sched, reqs, on_step=lambda out, res: chunks_per_step.append(
            sum(len(e.token_ids) > 1 for e in out.scheduled)))
        assert sched.bm.num_used == 0
        return got, max(chunks_per_step)

    reference, uncapped = run()
    got, capped = run(max_num_partial_prefills=cap)
    assert got == reference
    assert capped == cap < uncapped  # the cap was binding


def test_partial_prefill_cap_must_be_positive():
    with pytest.raises(ValueError, match="max_num_partial_prefills=0 must be >= 1"):
        make_scheduler(num_blocks=8, max_num_partial_prefills=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_identical_under_memory_pressure(seed):
    reqs = random_workload(seed)
    big = make_scheduler(num_blocks=400, max_num_seqs=16, max_num_batched_tokens=64)
    reference = run_to_completion(big, reqs)
    assert big.num_preemptions == 0
    chunked = []
    for caching in (True, False):
        tiny = make_scheduler(num_blocks=12, max_num_seqs=6, max_num_batched_tokens=8,
                              prefix_caching=caching)
        got = run_to_completion(tiny, reqs, on_step=lambda out, res: chunked.extend(
            e for e in out.scheduled if not e.sample))
        assert got == reference
        assert tiny.num_preemptions > 0 and chunked  # the pressure was real
        assert tiny.bm.num_used == 0 and tiny.bm.num_free == 12
        assert not tiny.waiting and not tiny.running and not tiny.seqs


def test_prefix_cache_hits_on_shared_prefix():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=64)
    prefix = list(range(1, 17))
    dev = FakeDevice(64, 4)
    run_to_completion(sched, [("a", prefix + [20, 21], Params(max_tokens=2))], device=dev)
    starts = []
    got = run_to_completion(sched, [("b", prefix + [30], Params(max_tokens=2))], device=dev,
                            on_step=lambda out, res: starts.append(out.scheduled[0].start_pos))
    assert starts[0] == 16  # the 16 shared tokens were not recomputed
    assert sched.bm.stats().prefix_hit_tokens == 16
    fresh = run_to_completion(make_scheduler(64, prefix_caching=False),
                              [("b", prefix + [30], Params(max_tokens=2))])
    assert got == fresh


@pytest.mark.parametrize("caching", [True, False])
def test_parallel_sampling_shares_prompt_blocks(caching):
    prompt = [random.Random(3).randrange(1, 50) for _ in range(30)]
    params = Params(max_tokens=6, ignore_eos=True)

    def peak_blocks(reqs):
        sched = make_scheduler(num_blocks=200, max_num_batched_tokens=128, prefix_caching=caching)
        peak = []
        outs = run_to_completion(sched, reqs, on_step=lambda o, r: peak.append(sched.bm.num_used))
        return max(peak), outs

    shared, outs = peak_blocks([("r", prompt, Params(max_tokens=6, n=4, ignore_eos=True))])
    independent, _ = peak_blocks([(f"r{i}", prompt, params) for i in range(4)])
    assert shared < independent
    samples = outs["r"]
    assert [s[0] for s in samples] == [0, 1, 2, 3]
    assert [s[1][0] for s in samples] == [next_token(prompt, j, 50) for j in range(4)]
    assert all(len(s[1]) == 6 and s[2] == "length" for s in samples)


@pytest.mark.parametrize("prompt_len,max_tokens,match", [
    (0, 4, "empty prompt"),
    (65, 4, "longer than max_model_len=64"),
    (30, 4, "need 9 KV blocks of 4, but the pool has only 8"),
    (20, 20, "need 10 KV blocks"),
])
def test_impossible_requests_rejected_before_any_state_change(prompt_len, max_tokens, match):
    sched = make_scheduler(num_blocks=8, max_model_len=64)
    with pytest.raises(ValueError, match=match):
        sched.add_request("x", list(range(prompt_len)), Params(max_tokens=max_tokens))
    assert not sched.waiting and not sched.requests and not sched.has_unfinished()
    sched.add_request("x", [1, 2], Params(max_tokens=4))  # the id was not taken


def test_bad_params_and_duplicate_ids_are_value_errors():
    sched = make_scheduler(num_blocks=8, max_num_seqs=4)
    with pytest.raises(ValueError, match="max_tokens=0"):
        sched.add_request("a", [1], Params(max_tokens=0))
    with pytest.raises(ValueError, match="n=5 exceeds max_num_seqs=4"):
        sched.add_request("a", [1], Params(n=5))
    sched.add_request("a", [1], Params())
    with pytest.raises(ValueError, match="'a' is already in use"):
        sched.add_request("a", [2], Params())
    assert len(sched.waiting) == 1


def test_abort_frees_blocks_and_unknown_id_is_value_error():
    sched = make_scheduler(num_blocks=16)
    dev = FakeDevice(16, 4)
    with pytest.raises(ValueError, match="unknown request id 'nope'"):
        sched.abort("nope")
    sched.add_request("a", list(range(1, 10)), Params(max_tokens=20, ignore_eos=True))
    sched.add_request("b", list(range(1, 6)), Params(max_tokens=3, n=2, ignore_eos=True))
    out = sched.schedule()
    sched.update(out, dev.step(out))
    assert sched.bm.num_used > 0
    req = sched.abort("a")
    assert all(s.status is SequenceStatus.FINISHED_ABORTED and s.finish_reason == "abort"
               for s in req.seqs)
    out = sched.schedule()
    assert {e.request_id for e in out.scheduled} == {"b"}
    sched.abort("b")  # between schedule() and update(): update skips it
    res = sched.update(out, dev.step(out))
    assert res.finished == [] and not sched.has_unfinished()
    sched.bm.check_invariants()
    assert sched.bm.num_used == 0
    with pytest.raises(ValueError, match="unknown request id 'a'"):
        sched.abort("a")


def test_abort_of_a_preempted_request():
    sched = make_scheduler(num_blocks=4, max_num_batched_tokens=16)
    dev = FakeDevice(4, 4)
    sched.add_request("old", [1, 2, 3], Params(max_tokens=12, ignore_eos=True))
    sched.add_request("new", [4, 5, 6], Params(max_tokens=12, ignore_eos=True))
    while not sched.num_preemptions:
        out = sched.schedule()
        sched.update(out, dev.step(out))
    victim = sched.get_request("new").seqs[0]
    assert victim.status is SequenceStatus.PREEMPTED and victim in sched.waiting
    sched.abort("new")
    assert not sched.waiting
    sched.bm.check_invariants()


def test_stop_conditions():
    sched = make_scheduler(num_blocks=32, eos_token_id=0, max_model_len=12)
    sched.add_request("eos", [5], Params(max_tokens=10))
    sched.add_request("ignore", [5], Params(max_tokens=3, ignore_eos=True))
    sched.add_request("stop", [5], Params(max_tokens=10, stop_token_ids=(7,)))
    sched.add_request("cap", list(range(1, 11)), Params(max_tokens=10, ignore_eos=True))
    script = {"eos": [4, 0], "ignore": [0, 0, 0], "stop": [7], "cap": [3, 3]}
    done = {}
    while sched.has_unfinished():
        out = sched.schedule()
        sampled = {e.seq_id: script[e.request_id].pop(0) for e in out.scheduled if e.sample}
        for req in sched.update(out, sampled).finished:
            seq = req.seqs[0]
            done[req.request_id] = (seq.output_token_ids, seq.finish_reason, seq.stop_reason)
    assert done == {"eos": ([4, 0], "stop", 0), "ignore": ([0, 0, 0], "length", None),
                    "stop": ([7], "stop", 7), "cap": ([3, 3], "length", None)}
    assert sched.bm.num_used == 0


def test_update_needs_the_latest_output_and_all_samples():
    sched = make_scheduler(num_blocks=8)
    sched.add_request("a", [1, 2], Params(n=2))
    sched.add_request("b", [3], Params())
    out = sched.schedule()
    a, b = (e.seq_id for e in out.scheduled)
    with pytest.raises(ValueError, match="needs 2 sampled tokens, got 1"):
        sched.update(out, {a: 5, b: 6})
    with pytest.raises(ValueError, match=f"no sampled token for sequence {b}"):
        sched.update(out, {a: [5, 6]})
    assert all(s.num_computed_tokens == 0 for s in sched.running)  # nothing changed
    res = sched.update(out, {a: [5, 6], b: 7})  # the same output can still be applied
    assert res.new_token_ids == {a: 5, b: 7, max(sched.seqs): 6}
    stale = sched.schedule()
    sched.schedule()
    with pytest.raises(ValueError, match="latest schedule"):
        sched.update(stale, {})


def test_fork_sequence_for_beams_shares_blocks():
    sched = make_scheduler(num_blocks=16, eos_token_id=None)
    dev = FakeDevice(16, 4)
    sched.add_request("b", [1, 2, 3, 4, 5, 6], Params(max_tokens=4))
    out = sched.schedule()
    sched.update(out, dev.step(out))
    parent = sched.get_request("b").seqs[0]
    child = sched.fork_sequence(parent.seq_id)
    assert sched.bm.get_block_table(child.seq_id) == sched.bm.get_block_table(parent.seq_id)
    assert child.output_token_ids == parent.output_token_ids and child.index == 1
    out = sched.schedule()
    assert len(out.copies) == 1  # the shared partial block: the first writer copies it
    sched.update(out, dev.step(out))
    sched.bm.check_invariants()


def test_without_chunked_prefill_prompts_run_whole():
    with pytest.raises(ValueError, match="max_num_batched_tokens=8 must be >= max_model_len=64"):
        make_scheduler(num_blocks=32, max_num_batched_tokens=8, enable_chunked_prefill=False)
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=64, enable_chunked_prefill=False)
    sizes = []
    run_to_completion(sched, random_workload(4, with_n=False),
                      on_step=lambda out, res: sizes.extend(e.sample for e in out.scheduled))
    assert all(sizes)  # every scheduled entry ends its prompt (or is a decode)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=8),
       outputs=st.lists(st.integers(0, 9), max_size=8), data=st.data())
def test_token_slice_matches_full_slice(prompt, outputs, data):
    seq = Sequence(0, Request("r", prompt, Params()), 0, outputs)
    n = len(prompt) + len(outputs)
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    assert seq.token_slice(start, stop) == (prompt + outputs)[start:stop]


# ---- multi-step decoding (num_scheduler_steps) --------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_blocks,max_num_seqs", [(400, 16), (12, 6)])  # roomy; preempting and pool-short
def test_multi_step_decoding_gives_single_steps_outputs(seed, num_blocks, max_num_seqs):
    """K decode steps a schedule (n > 1, stop tokens, prefix hits, preemption) emit exactly what single steps do."""
    reqs = random_workload(seed)
    reference = run_to_completion(make_scheduler(num_blocks=400, max_num_seqs=16, max_num_batched_tokens=64), reqs)
    for steps in (2, 4):
        sched = make_scheduler(num_blocks=num_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=8,
                               num_scheduler_steps=steps)
        ahead = []
        got = run_to_completion(sched, reqs, on_step=lambda out, res: ahead.extend(
            e.num_lookahead for e in out.scheduled))
        assert got == reference
        assert max(ahead) == steps - 1  # multi-steps did run
        assert sched.bm.num_used == 0 and sched.bm.num_free == num_blocks


def test_multi_step_runs_only_when_every_running_sequence_decodes_and_no_waiting_one_could_start():
    sched = make_scheduler(num_blocks=64, max_num_seqs=2, max_num_batched_tokens=8, num_scheduler_steps=4)
    dev = FakeDevice(64, 4)
    sched.add_request("a", [1, 2, 3], Params(max_tokens=10))
    sched.add_request("b", [4, 5], Params(max_tokens=3))
    a = sched.requests["a"].seqs[0]

    def step():
        out = sched.schedule()
        sched.update(out, dev.step(out))
        return [(e.request_id, len(e.token_ids), e.num_lookahead) for e in out.scheduled], out.num_batched_tokens

    assert step() == ([("a", 3, 0), ("b", 2, 0)], 5)  # prefills: one step
    # every running sequence decodes: b has 2 tokens left (one step ahead), a up to 3; 2 tokens charged, not 6
    assert step() == ([("a", 1, 3), ("b", 1, 1)], 2)
    sched.add_request("c", [6], Params(max_tokens=2))  # b finished: c has a seat, so one step while it starts
    assert step() == ([("a", 1, 0), ("c", 1, 0)], 2)
    sched.add_request("d", [7], Params(max_tokens=2))  # no seat for d: a and c decode 4 steps (c's last token)
    assert step() == ([("a", 1, 3), ("c", 1, 0)], 2)
    assert len(a.output_token_ids) == 1 + 4 + 1 + 4 and a.is_finished and sched.bm.num_used == 0  # c ended too


def test_multi_step_cut_at_a_stop_token_frees_the_unused_slots():
    sched = make_scheduler(num_blocks=64, num_scheduler_steps=4)
    dev = FakeDevice(64, 4)
    sched.add_request("a", [1, 2, 3], Params(max_tokens=20))
    out = sched.schedule()
    sched.update(out, dev.step(out))  # prompt (3) + 1 output
    out = sched.schedule()
    (e,) = out.scheduled
    assert e.num_lookahead == 3 and len(e.block_table) == 2  # slots for positions 3..6
    res = sched.update(out, {e.seq_id: [5, 6, 7, 8]})
    seq = sched.requests["a"].seqs[0]
    assert res.new_token_ids == {e.seq_id: 8} and seq.num_computed_tokens == 7 and sched.bm.num_used == 2
    out = sched.schedule()
    (e,) = out.scheduled
    res = sched.update(out, {e.seq_id: [9, 0, 11, 12]})  # EOS (0) second: the rest is dropped
    assert seq.output_token_ids[-2:] == [9, 0] and [r.request_id for r in res.finished] == ["a"]
    assert sched.bm.num_used == 0


def test_multi_step_never_preempts_for_its_lookahead():
    sched = make_scheduler(num_blocks=3, num_scheduler_steps=4)
    dev = FakeDevice(3, 4)
    sched.add_request("a", [1, 2, 3, 4, 5, 6, 7], Params(max_tokens=5))
    sched.add_request("b", [1, 2, 3], Params(max_tokens=5))
    out = sched.schedule()
    sched.update(out, dev.step(out))  # a: 2 blocks, b: 1 block; the pool is full
    out = sched.schedule()
    # a's next position (7) fits its second block, b's (3) its only one, but no block is left for more
    assert [(e.request_id, e.num_lookahead) for e in out.scheduled] == [("a", 0), ("b", 0)] and not out.preempted


def test_multi_step_needs_a_positive_count_and_no_speculation():
    with pytest.raises(ValueError, match="num_scheduler_steps=0 must be >= 1"):
        make_scheduler(num_blocks=8, num_scheduler_steps=0)
    with pytest.raises(ValueError, match="num_scheduler_steps=4 and num_lookahead_slots=3"):
        make_scheduler(num_blocks=8, num_scheduler_steps=4, num_lookahead_slots=3)
