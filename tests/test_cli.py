"""The command line: ``jaxserve generate`` and ``jaxserve bench throughput`` with ``--speculative-config``."""
import json

import pytest

from jaxserve.cli import main
from jaxserve.speculative.config import SpeculativeConfig


def test_speculative_config_from_json():
    spec = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 2, "max_ngram": 4}')
    assert spec == SpeculativeConfig(method="ngram", num_speculative_tokens=2, max_ngram=4)
    for text, match in [('{"gamma": 3}', r"unknown speculative config key\(s\) \['gamma'\]"),
                        ("{method: ngram}", "not valid JSON"), ("[1, 2]", "must be a JSON object"),
                        ('{"method": "lookahead"}', "method must be one of")]:
        with pytest.raises(ValueError, match=match):
            SpeculativeConfig.from_json(text)


def test_generate_with_speculation_prints_the_greedy_text(capsys):
    # tests/server/conftest.py's ENGINE: its warmed-up server (same worker) or, on jaxlib >= 0.11, the shared
    # compilation cache already holds the plain run's step programs
    args = ["generate", "--model", "jaxserve/tiny-code", "--prompt", "def fibonacci(n):", "--max-tokens", "12",
            "engine.max_num_seqs=8", "engine.max_num_batched_tokens=64", "engine.max_model_len=128",
            "engine.num_kv_blocks=96"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']) == 0
    assert capsys.readouterr().out == plain  # greedy speculation emits the target's own tokens
    assert main(args + ["--speculative-config", '{"num_speculative_tokens": 0}']) == 2
    assert "num_speculative_tokens must be an int >= 1" in capsys.readouterr().err
    assert main(args + ["--matmul-dtype", "int8"]) == 2
    assert "matmul_dtype must be None or one of" in capsys.readouterr().err


def test_bench_throughput_with_speculation(tmp_path):
    out = tmp_path / "r.json"
    argv = ["bench", "throughput", "--model", "random:tiny-llama", "--num-prompts", "2", "--input-len", "4", "8",
            "--output-len", "4", "8", "--max-model-len", "32", "--out", str(out),
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "engine.max_num_seqs=2",
            "engine.max_num_batched_tokens=32"]  # one fill bucket: warm-up compiles every bucket
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["spec_method"] == "ngram" and r["spec_gamma"] == 2
    assert r["backend_info"]["engine"]["max_num_seqs"] == r["options"]["max_num_seqs"] == 2  # the override, no flag
    assert r["spec_generated"] == r["output_tokens"]  # counted over the timed run only
    assert r["spec_rounds"] > 0 and r["compilations_after_warmup"] == 0  # LLM.warmup covered the spec programs
    assert main(argv + ["--backend", "hf"]) == 2  # speculation is the jaxserve backend's, raised before any run


# ---- issue 25: every user error is "jaxserve: error: ..." and exit 2, never a traceback ---------

def _hf_dir(path, config):
    (path / "config.json").write_text(json.dumps(config) if not isinstance(config, str) else config)
    return str(path)


@pytest.mark.parametrize("case, message", [
    ("missing dir", "is not a zoo name"),
    ("config []", "config.json must hold a JSON object, got list"),
    ("config '4096'", "vocab_size must be an integer, got '4096'"),
    ("config missing key", "lacks the required key 'hidden_size'"),
    ("corrupt checkpoint", "jaxserve_config.json does not match its sha256"),
    ("bad override", "bad override 'engine.block_size=abc'"),
    ("bad temperature", "SamplingParams.temperature must be a finite number >= 0, got nan"),
    ("bad n", "SamplingParams.n must be >= 1, got 0"),
])
def test_user_errors_exit_2_with_a_message(tmp_path, capsys, case, message):
    import shutil
    from jaxserve.zoo import zoo_path
    cfg = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
           "num_hidden_layers": 1, "num_attention_heads": 2}
    model, extra = "jaxserve/tiny-code-draft", []
    if case == "missing dir":
        model = str(tmp_path / "nowhere")
    elif case.startswith("config"):
        bad = {"config []": [], "config '4096'": {**cfg, "vocab_size": "4096"},
               "config missing key": {k: v for k, v in cfg.items() if k != "hidden_size"}}[case]
        model = _hf_dir(tmp_path, bad)
    elif case == "corrupt checkpoint":
        model = str(tmp_path / "ckpt")
        shutil.copytree(zoo_path("tiny-code-draft"), model)
        with open(f"{model}/jaxserve_config.json", "a") as f:
            f.write(" ")
    elif case == "bad override":
        extra = ["engine.block_size=abc"]
    elif case == "bad temperature":
        extra = ["--temperature", "nan"]
    elif case == "bad n":
        extra = ["-n", "0"]
    code = main(["generate", "--model", model, "--prompt", "x", "--max-tokens", "2", *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("jaxserve: error: ") and message in err, err
    assert "Traceback" not in err
