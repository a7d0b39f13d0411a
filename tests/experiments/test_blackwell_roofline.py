"""experiments/blackwell_roofline: invariants of its predictions (device=none: pure arithmetic and plots;
tests/experiments/test_smoke.py runs the whole smoke preset, measured validation included)."""
import json

import pytest

from experiments.harness import main


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = main("blackwell_roofline", ["preset=smoke", "device=none", f"out_dir={tmp_path_factory.mktemp('roofline')}"])
    with open(f"{out}/results.json") as f:
        return json.load(f)


def test_smoke_reports_claims_and_predictions(smoke):
    assert smoke["meta"]["complete"]
    claims = {r["claim"]: r["value"] for r in smoke["tables"]["seed_claims"]}
    assert claims["B200 memory bandwidth / H100 SXM's (> 2x)"] > 2
    summary = smoke["tables"]["summary"]
    assert len(summary) == 3 * 3 * 3  # GPUs x models x formats
    for r in summary:
        assert r["capacity"] >= 16  # the TP degree chosen holds min_requests
        assert r["tp"] & (r["tp"] - 1) == 0
    assert "validation" not in smoke["tables"]
    assert set(smoke["figures"]) == {"decode_tokens_per_gpu"}
    for r in smoke["sweep"]:
        assert r["fits"] == (r["batch"] <= next(s["capacity"] for s in summary if s["gpu"] == r["gpu"]
                                               and s["model"] == r["model"] and s["format"] == r["format"]))


def test_faster_gpu_and_fewer_bits_predict_more_tokens(smoke):
    by = {(r["gpu"], r["model"], r["format"], r["batch"]): r["tokens_per_s_per_gpu"] for r in smoke["sweep"]}
    for model in ("Llama-3-70B", "Mixtral-8x7B", "DeepSeek-V3"):
        assert by["B200", model, "nvfp4", 1] > by["B200", model, "fp8", 1] > by["H100 SXM", model, "fp8", 1]


def test_bad_override_is_refused_before_running():
    with pytest.raises(SystemExit, match="unknown \\['fp6'\\]"):
        main("blackwell_roofline", ["formats=[fp6]"])
