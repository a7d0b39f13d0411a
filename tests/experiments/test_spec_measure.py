"""The speculative benchmark's timing: each point's calls alternate with its own baseline's."""
import math

import numpy as np
import pytest

from experiments.spec_decoding.measure import _decode_speedup, _interleaved, _per_set, _timed_sets


def test_interleaved_warms_each_call_then_alternates_and_keeps_the_fastest():
    log, hooked = [], []
    calls = {"base": lambda: log.append("base") or len(log), "spec": lambda: log.append("spec") or len(log)}
    timed = _interleaved(calls, repeats=3, after_warmup=lambda: hooked.append(len(log)))
    assert log == ["base", "spec"] * 4  # one untimed warm-up each, then three timed rounds
    assert hooked == [2]  # the hook runs between the warm-up and the timed calls
    assert set(timed) == {"base", "spec"}
    assert timed["base"][1] == 7 and timed["spec"][1] == 8  # the output of each one's last call
    assert all(seconds >= 0 for seconds, _ in timed.values())


def test_prompt_sets_are_timed_set_by_set_and_summed():
    log = []

    def gen(side):
        def call(prompts, lens, seeds):
            log.append((side, int(prompts[0, 0]), tuple(seeds)))
            return None, np.array([len(seeds)]), {"rows": np.asarray(seeds)}
        return call
    sets = np.arange(3)[:, None, None] * np.ones((3, 2, 4), int)  # three sets of two prompts
    lens = np.full((3, 2), 4)
    out = _timed_sets({"base": _per_set(gen("base"), sets, lens, 10), "spec": _per_set(gen("spec"), sets, lens, 10)},
                      repeats=2)
    # alternation set by set (base 0, spec 0, base 1, ...), each call once untimed then twice timed
    assert [(side, s) for side, s, _ in log] == [(side, s) for s in range(3) for side in ("base", "spec")] * 3
    assert {seeds for _, s, seeds in log if s == 1} == {(12, 13)}  # seeds unique across sets
    seconds, outs = out["spec"]
    assert seconds >= 0 and [seeds["rows"].tolist() for _, _, seeds in outs] == [[10, 11], [12, 13], [14, 15]]


def test_decode_speedup_leaves_out_each_rows_first_token_and_the_prefill():
    # 2 rows x 64 tokens: baseline 1.0 s of which 0.2 s prefill, speculative 0.6 s of which 0.25 s
    assert _decode_speedup(128, 0.6, 0.25, 128, 1.0, 0.2, rows=2) == pytest.approx((126 / 0.35) / (126 / 0.8))
    assert 128 / 0.6 / (128 / 1.0) < _decode_speedup(128, 0.6, 0.25, 128, 1.0, 0.2, rows=2)  # prefill dilutes e2e
    assert math.isnan(_decode_speedup(128, 0.2, 0.25, 128, 1.0, 0.2, rows=2))  # noise: no time after the prefill
    assert math.isnan(_decode_speedup(2, 0.6, 0.25, 128, 1.0, 0.2, rows=2))  # nothing after the first tokens
