import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from tests.xla_flags import with_devices

from jaxserve.models.checkpoint import load_model
from jaxserve.train import parse_run_config, train
from jaxserve.train.data import BatchOrder, encode_split, prompt_windows, windows
from tests.train.conftest import with_train


@pytest.fixture(scope="module")
def full_run(tiny_run):
    """An uninterrupted 6-step run (checkpoints at 3 and 6)."""
    return train(tiny_run, progress=False)


def _metrics(result) -> list[dict]:
    return [json.loads(line) for line in (result["out_dir"] / "metrics.jsonl").read_text().splitlines()]


def test_training_reduces_loss(full_run):
    losses = [r["loss"] for r in _metrics(full_run) if "loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert full_run["final_eval"]["val_ppl"] > 1 and (full_run["out_dir"] / "final" / "tokenizer.json").exists()
    assert (full_run["out_dir"] / "training_curve.png").stat().st_size > 1000


def test_resume_is_bit_identical(tiny_run, full_run, tmp_path):
    interrupted = with_train(tiny_run, out_dir=str(tmp_path / "resumed"))
    first = train(interrupted, stop_after=4, progress=False)  # as if killed after step 4: checkpoints at 3, 4
    assert first["step"] == 4 and first["final_eval"] is None
    resumed = train(interrupted, progress=False)  # continues from step 4 with the same data order
    assert resumed["step"] == 6
    chex.assert_trees_all_equal(jax.device_get(full_run["params"]), jax.device_get(resumed["params"]))
    strip = lambda rows: [{k: v for k, v in row.items() if k != "elapsed_s"} for row in rows]
    assert strip(_metrics(full_run)) == strip(_metrics(resumed))


def test_batch_order_is_a_permutation_per_epoch_and_seeded():
    order = BatchOrder(num_windows=10, batch_size=5, seed=3)
    epoch0 = np.concatenate([order.indices(0), order.indices(1)])
    assert sorted(epoch0) == list(range(10))
    assert not np.array_equal(epoch0, np.concatenate([order.indices(2), order.indices(3)]))
    assert np.array_equal(BatchOrder(10, 5, 3).indices(3), order.indices(3))
    assert not np.array_equal(BatchOrder(10, 5, 4).indices(0), order.indices(0))


def test_windows_cover_stream_with_shifted_targets():
    w = windows(np.arange(21, dtype=np.int32), 4)
    assert w.shape == (5, 5) and np.array_equal(w[1], [4, 5, 6, 7, 8])
    with pytest.raises(ValueError, match="too short"):
        windows(np.arange(3, dtype=np.int32), 4)


def test_prompt_windows_are_seeded_slices_of_the_val_stream():
    from jaxserve.tokenizer import load_tokenizer
    from jaxserve.zoo import zoo_path
    tok = load_tokenizer(zoo_path("tiny-code"))
    prompts = prompt_windows(tok, tok.vocab_size, 3, 16, seed=1)
    stream = encode_split(tok, None, "val", max_tokens=200_000)
    slices = np.lib.stride_tricks.sliding_window_view(stream, 16)
    starts = [np.flatnonzero((slices == p).all(axis=1)) for p in prompts]  # where each prompt stands
    assert prompts.shape == (3, 16) and all(len(at) > 0 for at in starts)
    np.testing.assert_array_equal(prompt_windows(tok, tok.vocab_size, 3, 16, seed=1), prompts)
    ids = prompt_windows(None, 7, 4, 5, seed=0)  # no tokenizer: random ids below the vocabulary size
    assert ids.shape == (4, 5) and ids.min() >= 0 and ids.max() < 7 and len(np.unique(ids)) > 1


def test_parse_run_config_presets_and_overrides():
    rc = parse_run_config(["model=tiny-code", "train.steps=7", "model.num_layers=3", "data.seq_len=128"])
    assert (rc.model.hidden_size, rc.model.num_layers, rc.train.steps, rc.data.seq_len) == (256, 3, 7, 128)


@pytest.mark.parametrize("args, error, match", [
    (["model=no-such-model"], ValueError, "unknown model preset 'no-such-model'"),
    (["train.no_such_field=1"], ValueError, "no_such_field"),
    (["train.steps=many"], ValueError, "train.steps=many"),
    (["train.batch_size=6", "train.grad_accum=4"], ValueError, "batch_size=6 must be a multiple of grad_accum=4"),
    (["model=tiny-code", "data.seq_len=1024"], ValueError, "seq_len=1024 exceeds"),
    (["steps"], ValueError, "not of the form key=value"),
])
def test_bad_arguments_raise_clear_errors(args, error, match):
    with pytest.raises(error, match=match):
        parse_run_config(args)


def test_missing_corpus_or_tokenizer_raise_before_writing(tiny_run, tmp_path):
    rc = with_train(tiny_run, out_dir=str(tmp_path / "never"))
    missing = dataclasses.replace(rc.data, corpus=str(tmp_path / "nope.jsonl.xz"))
    with pytest.raises(FileNotFoundError, match="nope.jsonl.xz does not exist"):
        train(dataclasses.replace(rc, data=missing), progress=False)
    missing = dataclasses.replace(rc.data, tokenizer=str(tmp_path / "tok.json"))
    with pytest.raises(FileNotFoundError, match="tok.json does not exist"):
        train(dataclasses.replace(rc, data=missing), progress=False)
    assert not (tmp_path / "never").exists()


def test_vocab_mismatch_raises_before_writing(tiny_run, tmp_path):
    rc = with_train(tiny_run, out_dir=str(tmp_path / "never"))
    bad = dataclasses.replace(rc, model=rc.model.replace(vocab_size=rc.model.vocab_size + 1))
    with pytest.raises(ValueError, match=r"tokenizer has \d+ tokens but model.vocab_size"):
        train(bad, progress=False)
    assert not (tmp_path / "never").exists()


def _as_overrides(rc) -> list[str]:
    # OmegaConf reads a bare "key=" as null, so empty strings (init_from="", corpus="") are quoted.
    def spell(v):
        if isinstance(v, (tuple, list)):  # "()" is a string to OmegaConf; "[a,b]" is a list
            return "[" + ",".join(map(str, v)) + "]"
        return "null" if v is None else "''" if v == "" else v
    return [f"{section}.{k}={spell(v)}" for section, fields in dataclasses.asdict(rc).items()
            for k, v in fields.items()]


@pytest.mark.slow  # a fresh process, compile and export: ~20 s of CPU; the only multi-device check here
def test_cli_data_parallel_over_two_devices_matches_one(tiny_run, full_run, tmp_path):
    """`python -m jaxserve.train` on 2 simulated CPU devices (batch sharded on "data") ~ the 1-device run."""
    rc = with_train(tiny_run, out_dir=str(tmp_path / "dp"))
    env = {**os.environ, "XLA_FLAGS": with_devices(2), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "jaxserve.train", *_as_overrides(rc)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, params = load_model(tmp_path / "dp" / "final")
    chex.assert_trees_all_close(params, jax.device_get(full_run["params"]), atol=1e-5, rtol=1e-4)
