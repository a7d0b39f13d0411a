"""``benchmarks/profile_step.py``'s host share of a step, on a synthetic trace: the time no program ran, and the
jitted calls' part of it before their program started."""
import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "profile_step.py"
spec = importlib.util.spec_from_file_location("profile_step", SCRIPT)
profile_step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_step)

RUN = "ThunkExecutor::Execute (wait for completion)"


def ev(name, ts, dur):
    return {"name": name, "ts": ts, "dur": dur, "ph": "X"}


def test_host_share_is_each_step_less_its_programs_and_the_calls_before_them():
    events = sorted([
        # step 1: 10 ms; a jitted call at 1 ms whose program starts at 3 ms and runs 6 ms
        ev("$llm_engine.py:198 step", 0, 10_000), ev("PjitFunction(plain_step)", 1_000, 2_500), ev(RUN, 3_000, 6_000),
        # step 2: 8 ms; two calls, programs of 3 and 2 ms, the first starting 1 ms after its call
        ev("$llm_engine.py:198 step", 20_000, 8_000), ev("PjitFunction(copy_step)", 20_500, 1_000),
        ev(RUN, 21_500, 3_000), ev("PjitFunction(plain_step)", 25_000, 500), ev(RUN, 25_200, 2_000),
    ], key=lambda e: e["ts"])
    share = profile_step.host_share(events)
    host, dispatch = share.values()
    assert host == pytest.approx(((10 - 6) + (8 - 5)) / 2)  # ms a step with no program running
    assert dispatch == pytest.approx(((3 - 1) + (1.0 + 0.2)) / 2)
    assert profile_step.host_share([ev(RUN, 0, 5)]) == {}  # no engine step in the trace
