"""The live-server sweep's reading (host only): normalized latency, where a latency curve crosses a limit,
when a sweep stops, and a server process that fails to start."""
import math

import pytest

from jaxserve.bench import rate_sweep
from jaxserve.bench.rate_sweep import sustained_rate, sweep
from jaxserve.bench.serve import RequestResult, summarize
from jaxserve.bench.server_process import ServerProcess


def test_normalized_latency_is_each_requests_latency_per_output_token():
    results = [RequestResult(ok=True, output_tokens=n, ttft=0.1, latency=lat) for n, lat in ((4, 2.0), (10, 1.0))]
    results.append(RequestResult(ok=False, error="boom", output_tokens=1, latency=50.0))  # failed: not counted
    s = summarize(results, duration=2.0)
    assert s["mean_norm_latency_ms"] == pytest.approx((500 + 100) / 2)
    assert s["p50_norm_latency_ms"] == pytest.approx(300) and s["p99_norm_latency_ms"] == pytest.approx(496)
    assert s["failed"] == 1 and s["errors"] == ["boom"]


@pytest.mark.parametrize("latencies, expected", [
    ([1.0, 1.5, 3.0], (3.0, "=")),  # crosses 2.0 a third of the way from rate 2 to 5
    ([1.0, 1.5, 1.9], (5.0, ">=")),  # never crosses: the top rate is a lower bound
    ([2.5, 3.0, 4.0], (1.0, "<")),  # over the limit already at the lowest rate
    ([1.0, math.inf, 1.0], (1.0, "=")),  # a failed point (inf): the last good rate
])
def test_sustained_rate(latencies, expected):
    rate, bound = sustained_rate([1.0, 2.0, 5.0], latencies, 2.0)
    assert (round(rate, 6), bound) == expected


def test_sweep_runs_rates_lowest_first_and_stops_past_the_knee(monkeypatch):
    seen = []

    def fake_bench(url, requests, rate, seed=0):
        seen.append(rate)
        return {"mean_norm_latency_ms": 10.0 * rate ** 2, "failed": 0, "errors": [], "date": "d"}
    monkeypatch.setattr(rate_sweep, "bench_rate", fake_bench)
    rows = sweep("http://x", [], [4.0, 1.0, 2.0, 3.0], stop_factor=5.0)
    assert seen == [1.0, 2.0, 3.0]  # 90 ms > 5 x 10 ms at rate 3: rate 4 is not run
    assert [r["rate"] for r in rows] == seen and all("load_1m" in r and "date" not in r for r in rows)
    assert len(sweep("http://x", [], [1.0, 2.0, 3.0, 4.0])) == 4  # no stop_factor: every rate


def test_a_server_that_cannot_start_is_an_error_with_its_output():
    with pytest.raises(RuntimeError, match=r"(?s)did not become healthy.*exit code 2.*no-such-model"):
        with ServerProcess("no-such-model", startup_timeout=120):
            pass
