"""``jaxserve bench throughput`` / ``latency`` across backends (issue 28): the workload file and the JSON
record every backend shares, jaxserve and HF transformers end to end on the same random weights (greedy:
the same tokens), and the peers (vLLM CPU, llama.cpp), which skip where their venv was not made."""
import json

import pytest

from jaxserve.bench.peers import DriverProcess, PeerError, missing
from jaxserve.bench.throughput import RECORD_KEYS, check_record
from jaxserve.bench.workload import load_workload, make_workload, save_workload
from jaxserve.cli import main

# one prefill bucket (32 tokens): the warm-up compiles every bucket, and the workloads here fit one
TINY = ["--model", "random:tiny-llama", "--max-model-len", "32", "--max-num-seqs", "2", "engine.max_num_batched_tokens=32"]
SMALL = ["--model", "random:small-llama", "--max-model-len", "64", "--max-num-seqs", "2"]  # vLLM wants head_dim 32


def needs_peer(name):
    """The peer's venv (benchmarks/peers/setup_*.sh), and torch: the peer is compared with the hf backend."""
    def mark(test):
        return pytest.mark.peers(pytest.mark.skipif(missing(name) is not None, reason=str(missing(name)))(test))
    return mark


def test_workload_file_round_trips_and_rejects_bad_files(tmp_path):
    requests = make_workload("sharegpt", 5, 100, 64, seed=1, length_scale=0.1)
    save_workload(tmp_path / "w.json", requests, name="sharegpt", vocab_size=100)
    assert load_workload(tmp_path / "w.json", vocab_size=100) == ("sharegpt", requests)
    fixed = make_workload("fixed", 3, 100, 64, input_len=(5, 9), output_len=(7, 9))
    assert [(len(r.prompt_token_ids), r.output_len) for r in fixed] == [(5, 7)] * 3
    with pytest.raises(ValueError, match="token id 9[0-9] >= the model's vocab_size 90"):
        load_workload(tmp_path / "w.json", vocab_size=90)
    doc = json.loads((tmp_path / "w.json").read_text())
    doc["requests"][2]["output_len"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"requests\[2\].output_len must be an int >= 1, got 0"):
        load_workload(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "x"}')
    with pytest.raises(ValueError, match="format must be 'jaxserve-workload/1', got 'x'"):
        load_workload(tmp_path / "other.json")


def _bench(tmp_path, name, argv):
    out = tmp_path / f"{name}.json"
    assert main(["bench", *argv, "--out", str(out)]) == 0
    return check_record(json.loads(out.read_text()))


@pytest.mark.peers  # the hf backend needs torch
def test_jaxserve_and_hf_serve_one_workload_file_to_the_same_greedy_tokens(tmp_path):
    requests = make_workload("random", 3, 512, 32, seed=2, input_len=(3, 9), output_len=(2, 6))
    save_workload(tmp_path / "w.json", requests, name="random", vocab_size=512)
    records = {b: _bench(tmp_path, b, ["throughput", *TINY, "--backend", b, "--workload", str(tmp_path / "w.json"),
                                       "--num-iters", "2"]) for b in ("jaxserve", "hf")}
    for b, r in records.items():
        assert set(RECORD_KEYS) <= set(r) and r["backend"] == b and r["schema"] == "jaxserve-bench/1"
        assert r["output_tokens"] == sum(q.output_len for q in requests) and len(r["runs_elapsed_s"]) == 2
        assert [len(h) for h in r["output_ids_head"]] == [min(q.output_len, 8) for q in requests]
    assert records["jaxserve"]["compilations_after_warmup"] == 0
    # --max-num-seqs reaches the engine (the engine.* overrides' default of 64 once replaced it)
    assert records["jaxserve"]["backend_info"]["engine"]["max_num_seqs"] == 2
    assert records["jaxserve"]["backend_info"]["engine"]["max_num_batched_tokens"] == 32
    # the KV budget vLLM gets too (--kv-cache-gib, default 1)
    assert records["jaxserve"]["backend_info"]["engine"]["kv_cache_bytes"] == 2**30
    assert records["jaxserve"]["output_ids_head"] == records["hf"]["output_ids_head"]  # same weights, greedy


def test_latency_record_and_the_options_checked_before_any_model_loads(tmp_path):
    r = _bench(tmp_path, "lat", ["latency", *TINY, "--backend", "jaxserve", "--input-len", "4", "--output-len", "5",
                                 "--num-iters", "3"])
    assert r["benchmark"] == "latency" and r["num_prompts"] == 1 and len(r["runs_elapsed_s"]) == 3
    assert r["percentiles_s"]["10"] <= r["percentiles_s"]["50"] <= r["percentiles_s"]["99"]
    assert r["ms_per_output_token"] == pytest.approx(1e3 * r["elapsed_s"] / 5)
    for bad in (["--gguf-type", "Q4_0"], ["--max-num-seqs", "0"], ["--gguf-file", "/nonexistent.gguf"],
                ["--kv-cache-gib", "0"]):
        assert main(["bench", "throughput", *TINY, *bad]) == 2
    assert main(["bench", "throughput", *TINY, "--backend", "llama.cpp", "--gguf-type", "Q4_X"]) == 2
    with pytest.raises(SystemExit, match="2"):  # argparse: invalid choice
        main(["bench", "throughput", *TINY, "--backend", "sglang"])
    with pytest.raises(ValueError, match="output_tokens_per_s"):
        check_record({**r, "output_tokens_per_s": r["output_tokens_per_s"] * 2})
    with pytest.raises(ValueError, match=r"missing \['machine'\]"):
        check_record({k: v for k, v in r.items() if k != "machine"})


def test_a_missing_peer_venv_is_named_with_its_setup_script(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSERVE_PEERS_DIR", str(tmp_path))
    assert "run bash benchmarks/peers/setup_llamacpp.sh" in missing("llama.cpp")
    with pytest.raises(PeerError, match="the vllm venv is missing"):
        DriverProcess("vllm", tmp_path, threads=1, max_num_seqs=1, max_model_len=8, dtype="float32",
                      log_path=tmp_path / "log")
    with pytest.raises(ValueError, match="unknown peer 'sglang'"):
        missing("sglang")


def _peer_matches_hf(tmp_path, peer):
    requests = make_workload("random", 3, 4096, 64, seed=3, input_len=(4, 12), output_len=(3, 9))
    save_workload(tmp_path / "w.json", requests, name="random", vocab_size=4096)
    records = {b: _bench(tmp_path, b, ["throughput", *SMALL, "--backend", b, "--workload", str(tmp_path / "w.json"),
                                       "--workdir", str(tmp_path / b)]) for b in (peer, "hf")}
    assert records[peer]["output_tokens"] == sum(q.output_len for q in requests)
    assert records[peer]["output_ids_head"] == records["hf"]["output_ids_head"]
    return records[peer]


@needs_peer("llama.cpp")
def test_llama_cpp_serves_the_exported_gguf_to_hf_s_greedy_tokens(tmp_path):
    r = _peer_matches_hf(tmp_path, "llama.cpp")
    assert r["backend_info"]["weights"].endswith("model-F32.gguf") and r["backend_info"]["n_seq_max"] == 2


@pytest.mark.slow  # vLLM's start-up compiles for ~90 s on 2 cores
@needs_peer("vllm")
def test_vllm_serves_the_exported_hf_dir_to_hf_s_greedy_tokens(tmp_path):
    r = _peer_matches_hf(tmp_path, "vllm")
    assert r["backend_info"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and "libiomp5" in r["backend_info"]["LD_PRELOAD"]
