"""The command line: ``jaxserve generate`` and ``jaxserve bench throughput`` with ``--speculative-config``."""
import json

import pytest

from jaxserve.cli import main
from jaxserve.spec.config import SpeculativeConfig


def test_speculative_config_from_json():
    spec = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 2, "max_ngram": 4}')
    assert spec == SpeculativeConfig(method="ngram", num_speculative_tokens=2, max_ngram=4)
    for text, match in [('{"gamma": 3}', r"unknown speculative config key\(s\) \['gamma'\]"),
                        ("{method: ngram}", "not valid JSON"), ("[1, 2]", "must be a JSON object"),
                        ('{"method": "eagle"}', "method must be one of")]:
        with pytest.raises(ValueError, match=match):
            SpeculativeConfig.from_json(text)


def test_generate_with_speculation_prints_the_greedy_text(capsys):
    args = ["generate", "--model", "jaxserve/tiny-code", "--prompt", "def fibonacci(n):", "--max-tokens", "12"]
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
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "engine.max_num_seqs=2"]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["spec_method"] == "ngram" and r["spec_gamma"] == 2
    assert r["spec_generated"] == r["output_tokens"]  # counted over the timed run only
    assert r["spec_compilations"] > 0 and r["compilations_after_warmup"] == 0  # LLM.warmup covered the spec programs
    assert main(argv + ["--backend", "hf"]) == 2  # speculation is the jaxserve backend's, raised before any run
