"""``jaxserve bench serve`` against the test server, and its arrival process."""
import json

import numpy as np
import pytest

from jaxserve.bench import serve as bench_serve
from jaxserve.bench.workload import gamma_arrivals, make_workload
from tests.server.conftest import API_KEY, ENGINE

pytestmark = pytest.mark.xdist_group("server")


def test_bench_serve_reports_every_request(served, tmp_path):
    out = tmp_path / "result.json"
    args = ["--base-url", served.url, "--api-key", API_KEY, "--num-prompts", "6", "--request-rate", "40",
            "--input-len", "4", "12", "--output-len", "3", "6", "--seed", "3", "--save-detailed", "--out", str(out)]
    assert bench_serve.main(args) == 0
    result = json.loads(out.read_text())
    expected = make_workload("random", 6, served.llm.engine.config.vocab_size, ENGINE["max_model_len"], 3,
                             input_len=(4, 12), output_len=(3, 6))
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["output_lens"] == [r.output_len for r in expected]  # ignore_eos: every drawn length
    assert result["total_input_tokens"] == sum(len(r.prompt_token_ids) for r in expected)
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"median_{m}_ms"] == result[f"p50_{m}_ms"] <= result[f"p99_{m}_ms"]
    assert result["mean_ttft_ms"] < result["mean_e2el_ms"]
    assert result["output_throughput"] == pytest.approx(result["total_output_tokens"] / result["duration"])
    assert all(len(itl) == n - 1 for itl, n in zip(result["itls"], result["output_lens"]))  # one chunk a token
    assert served.wait_idle()["kv_blocks_free"] == served.wait_idle()["kv_blocks_total"]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_rate_and_burstiness(burstiness):
    gaps = np.diff(gamma_arrivals(5.0, 8001, burstiness, seed=1))
    assert gaps.mean() == pytest.approx(0.2, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.08)  # Gamma's CV


def test_gamma_arrivals_errors():
    assert (gamma_arrivals(float("inf"), 3) == 0).all()
    with pytest.raises(ValueError, match="rate must be > 0"):
        gamma_arrivals(0, 3)
    with pytest.raises(ValueError, match="burstiness must be a finite number > 0, got -1"):
        gamma_arrivals(1.0, 3, -1)
