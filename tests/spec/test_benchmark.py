"""The speculative benchmark's timing: each point's calls alternate with its own baseline's."""
from jaxserve.spec.benchmark import _interleaved


def test_interleaved_warms_each_call_then_alternates_and_keeps_the_fastest():
    log, hooked = [], []
    calls = {"base": lambda: log.append("base") or len(log), "spec": lambda: log.append("spec") or len(log)}
    timed = _interleaved(calls, repeats=3, after_warmup=lambda: hooked.append(len(log)))
    assert log == ["base", "spec"] * 4  # one untimed warm-up each, then three timed rounds
    assert hooked == [2]  # the hook runs between the warm-up and the timed calls
    assert set(timed) == {"base", "spec"}
    assert timed["base"][1] == 7 and timed["spec"][1] == 8  # the output of each one's last call
    assert all(seconds >= 0 for seconds, _ in timed.values())
