"""Every experiment's smoke preset, run as users run it: ``python -m experiments.<name> preset=smoke``.

Experiments are discovered from ``experiments/*/__main__.py``, so a new one is covered without
editing this file. Each run goes to a temporary ``out_dir``; the test checks the harness contract
(files, metadata, resolved config, tables, figures) and, where ``CHECKS`` has an entry, invariants
of the experiment's own numbers that hold at any size.
"""
import dataclasses
import glob
import json
import math
import os
import subprocess
import sys

import pytest

from experiments import harness

ROOT = harness.ROOT
# experiments/<name>/__main__.py, and variants beside them: experiments/<name>/<variant>/__main__.py
NAMES = sorted(os.path.relpath(os.path.dirname(p), os.path.join(ROOT, "experiments")).replace(os.sep, ".")
               for p in glob.glob(os.path.join(ROOT, "experiments", "*", "__main__.py"))
               + glob.glob(os.path.join(ROOT, "experiments", "*", "*", "__main__.py")))
META_KEYS = {"experiment", "command", "preset", "date", "machine", "load_average", "python", "jax_version",
             "jaxlib_version", "backend", "devices", "git_commit", "complete", "seconds"}


def _rows(results, prefix):
    return [r for name, rows in results["tables"].items() if name.startswith(prefix) for r in rows]


def check_fp4_quant_error(res):
    by = {(r["distribution"], r["variant"]): r for r in res["tables"]["sqnr"]}
    for dist in res["config"]["distributions"]:
        # NVFP4's 16-element E4M3 scales beat MXFP4's 32-element power-of-two scales; FP8 beats both
        assert by[dist, "nvfp4"]["sqnr_db"] > by[dist, "mxfp4_floor"]["sqnr_db"], dist
        assert by[dist, "fp8_tensor"]["sqnr_db"] > by[dist, "nvfp4"]["sqnr_db"] + 5, dist
        assert by[dist, "nvfp4"]["bits_per_element"] == pytest.approx(4.5, abs=0.01)


def check_fp4_perplexity(res):
    rows = _rows(res, "ppl/")
    assert rows[0]["variant"] == res["config"]["baselines"][0] and rows[0]["delta_loss"] == 0
    for r in rows:
        assert 1 < r["val_ppl"] < res["model_configs"][res["config"]["models"][0]]["vocab_size"]
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
    assert all(r["bits_per_weight"] == pytest.approx(4.5, abs=0.05) for r in rows if r["variant"].startswith("nvfp4"))
    for r in _rows(res, "kernel/"):  # the Pallas kernel equals the reference up to rounding
        assert r["rel_diff"] <= max(1e-5, 2 * r["nudge_rel_diff"]), r
    for r in _rows(res, "sources/"):  # the zoo models are bf16 exports: rounding them to bf16 changes nothing
        assert r["delta_bfloat16"] == 0 and r["ppl_bfloat16"] == r["ppl_float32"], r


def check_moe_balance(res):
    for r in res["tables"]["variants"]:
        assert 0 <= r["max_vio_global"] <= res["config"]["num_experts"] - 1  # max load <= all assignments
        assert 1 < r["val_ppl"] < 256  # byte-level vocabulary
    assert [len(r["curve"]) for r in res["runs"]] == [res["config"]["steps"]] * len(res["runs"])


def check_moe_ep(res):
    for r in res["tables"]["points"]:
        assert r["sent_bytes"] >= r["live_bytes"] > 0
        assert (r["dropped"] == 0) if r["capacity_factor"] == 0 else (0 <= r["dropped"] < r["assignments"])


def check_vllm_paged(res):
    cfg, parts = res["config"], ("token_states", "reserved", "internal", "external", "free")
    for r in res["tables"]["serving"] + res["tables"]["block_size"] + res["tables"]["prefix"]:
        assert sum(r[f"kv_{k}"] for k in parts) == pytest.approx(1.0)  # the categories partition the memory
        assert r["normalized_latency"] >= 1.0 - 1e-9  # at most one token per step per sequence
    for r in res["tables"]["serving"]:
        assert r["requests"] == cfg[f"{r['dataset']}_requests"]
        if r["policy"] == "paged":
            assert r["kv_reserved"] == r["kv_external"] == 0
        else:
            assert r["preemptions"] == 0  # a reservation covers every sequence's growth
    for r in res["tables"]["sharing"]:
        assert 0 < r["saving"] < 1  # samples and beams share at least the prompt's full blocks
    caching = {(r["prefix_len"], r["prefix_caching"]): r for r in res["tables"]["prefix"] if r["policy"] == "paged"}
    for plen in cfg["prefix_lens"]:
        assert caching[plen, True]["throughput_req_per_step"] >= caching[plen, False]["throughput_req_per_step"]
    assert all(r["same_schedule_as_null_runner"] for r in res["tables"]["model"])


def check_vllm_paged_live_server(res):
    cfg = res["config"]
    for r in res["tables"]["points"]:
        assert r["completed"] == cfg["num_requests"] and r["failed"] == 0
        for m in ("ttft", "tpot", "e2el", "norm_latency"):
            assert 0 < r[f"p50_{m}_ms"] <= r[f"p99_{m}_ms"]
        assert r["mean_ttft_ms"] < r["mean_e2el_ms"]
        # a request's normalized latency is its end-to-end latency over at least 4 output tokens
        assert r["mean_norm_latency_ms"] <= r["mean_e2el_ms"] / 4 + 1e-6
    assert [r["policy"] for r in res["tables"]["sustained"]] == cfg["policies"]
    assert set(res["targets_s_per_token"]) == {"mean", "p99"}


def check_spec_decoding(res):
    cfg = res["config"]
    for r in _rows(res, ""):
        # batches smaller than min_prompts run several prompt sets per call, and every one of them generates
        sets = -(-cfg["min_prompts"] // r["batch"])
        assert r["prompts"] == sets * r["batch"] >= cfg["min_prompts"]
        per_row = cfg["max_tokens"] if r["path"] == "generate" else cfg["engine_max_tokens"]
        assert r["generated"] == r["prompts"] * per_row  # ignore_eos: each prompt to its max_tokens
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= r["gamma"] + 1
        # decode_speedup is NaN (null in the JSON) when noise leaves a smoke call no time after its prefill
        assert r["speedup"] > 0 and (r["decode_speedup"] is None or r["decode_speedup"] > 0)


CHECKS = {"fp4_quant_error": check_fp4_quant_error, "fp4_perplexity": check_fp4_perplexity,
          "moe_balance": check_moe_balance, "moe_ep": check_moe_ep, "vllm_paged": check_vllm_paged,
          "spec_decoding": check_spec_decoding, "vllm_paged.live_server": check_vllm_paged_live_server}


def test_every_experiment_is_discovered():
    assert {"fp4_quant_error", "fp4_perplexity", "moe_balance", "moe_ep"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_smoke_preset(name, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", f"experiments.{name}", "preset=smoke", f"out_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "results.json").read_text())
    assert META_KEYS <= set(res["meta"]) and res["meta"]["complete"] and res["meta"]["preset"] == "smoke"
    assert res["meta"]["command"] == f"python -m experiments.{name} preset=smoke out_dir={out}"
    conf = __import__(f"experiments.{name}.config", fromlist=["CONFIG"])
    expected, _, _ = harness.parse(name, conf, ["preset=smoke"])
    assert res["config"] == json.loads(json.dumps(harness._jsonable(dataclasses.asdict(expected))))
    assert res["tables"] and all(res["tables"].values()), "every table has rows"
    markdown = (out / "RESULTS.md").read_text()
    assert res["meta"]["command"] in markdown
    for fig in res["figures"].values():
        assert (out / fig["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({fig['file']})" in markdown
    if name in CHECKS:
        CHECKS[name](res)


@pytest.mark.parametrize("override, message", [
    ("nope=1", "'nope=1'"), ("rows=abc", "'rows=abc'"), ("preset=huge", "unknown preset 'huge'"), ("rows", "'rows'")])
def test_bad_argument_is_a_clear_error_before_anything_is_written(tmp_path, override, message):
    with pytest.raises(SystemExit, match=message):
        harness.main("fp4_quant_error", [override, f"out_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


def test_notes_survive_a_rerun_and_old_figures_go(tmp_path):
    writer = harness.ResultsWriter(str(tmp_path), "t", _meta(), config=_Cfg())
    with writer.figure("a") as ax:
        ax.plot([0, 1])
    with open(tmp_path / "RESULTS.md", "a") as f:
        f.write("\n## Notes\n\nhand-written\n")
    writer = harness.ResultsWriter(str(tmp_path), "t", _meta(), config=_Cfg())
    writer.table("x", [{"a": 1.0, "b": float("nan")}], fmt={"a": ".2f"})
    assert not (tmp_path / "a.png").exists()
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.endswith("## Notes\n\nhand-written\n") and "| 1.00 | n/a |" in text
    assert json.loads((tmp_path / "results.json").read_text())["tables"]["x"] == [{"a": 1.0, "b": None}]


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 1


def _meta():
    return {"command": "c", "date": "d", "git_commit": "g", "machine": "m", "load_average": "l",
            "jax_version": "j", "backend": "b", "preset": None}
