"""On-policy distillation data (``jaxserve.train.onpolicy``) and training on it (``data.train_windows``)."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxserve.models import init_params
from jaxserve.train import train
from jaxserve.train.onpolicy import OnPolicyConfig, generate_windows, sample_prompts
from tests.reference_forward import reference_logits
from tests.train.conftest import with_train

PROMPT, SEQ = 4, 16


@pytest.fixture(scope="module")
def teacher(tiny_run):
    return tiny_run.model, init_params(tiny_run.model, jax.random.key(3))


@pytest.fixture(scope="module")
def onpolicy(teacher):
    config, params = teacher
    stream = np.random.default_rng(0).integers(1, config.vocab_size, 500).astype(np.int32)
    prompts = sample_prompts(stream, 6, PROMPT, seed=1)
    return stream, prompts, generate_windows(params, config, prompts, SEQ, greedy_fraction=0.5, batch_size=4,
                                             seed=5, progress=False)


def test_prompts_are_cuts_of_the_stream(onpolicy):
    stream, prompts, _ = onpolicy
    cuts = np.lib.stride_tricks.sliding_window_view(stream, PROMPT)
    assert prompts.shape == (6, PROMPT)
    assert all((cuts == p).all(axis=1).any() for p in prompts)


def test_greedy_windows_are_the_teachers_argmax_continuations(teacher, onpolicy):
    config, params = teacher
    _, prompts, w = onpolicy
    assert w.shape == (6, SEQ + 1) and w.dtype == np.int32
    np.testing.assert_array_equal(w[:, :PROMPT], prompts)
    logits = reference_logits(params, config, w[:3, :-1])[:, PROMPT - 1:]  # greedy rows: the first half
    chosen = np.take_along_axis(logits, w[:3, PROMPT:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(chosen, logits.max(-1), atol=1e-4)  # the argmax, up to ties in float rounding


def test_sampled_windows_are_seeded_and_not_greedy(teacher, onpolicy):
    config, params = teacher
    _, prompts, w = onpolicy
    again = generate_windows(params, config, prompts[3:], SEQ, greedy_fraction=0.0, batch_size=4, seed=5 + 3,
                             progress=False)
    np.testing.assert_array_equal(again, w[3:])  # window i is a function of (prompt, seed + i) alone
    greedy = generate_windows(params, config, prompts[3:], SEQ, greedy_fraction=1.0, batch_size=4, seed=0,
                              progress=False)
    assert (greedy[:, PROMPT:] != w[3:, PROMPT:]).any()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="prompt_len"):
        OnPolicyConfig(prompt_len=300, seq_len=256)
    with pytest.raises(ValueError, match="greedy_fraction"):
        OnPolicyConfig(greedy_fraction=1.5)


def test_training_on_train_windows(tiny_run, onpolicy, tmp_path):
    _, _, w = onpolicy
    path = tmp_path / "w.npy"
    np.save(path, w)
    rc = with_train(tiny_run, out_dir=str(tmp_path / "run"))
    rc = dataclasses.replace(rc, data=dataclasses.replace(rc.data, train_windows=str(path), seq_len=SEQ))
    result = train(rc, progress=False)
    rows = [json.loads(line) for line in (result["out_dir"] / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]


def test_bad_train_windows_raise_before_writing(tiny_run, onpolicy, tmp_path):
    _, _, w = onpolicy
    rc = with_train(tiny_run, out_dir=str(tmp_path / "never"))
    cases = [(tmp_path / "missing.npy", None, FileNotFoundError, "missing.npy does not exist"),
             (tmp_path / "short.npy", w[:, :-1], ValueError, r"windows \[W, seq_len \+ 1 = 17\]"),
             (tmp_path / "ids.npy", w + tiny_run.model.vocab_size, ValueError, "outside"),
             (tmp_path / "float.npy", w.astype(np.float32), ValueError, "integer windows"),
             (tmp_path / "text.npy", b"not numpy", ValueError, "not a readable .npy array")]
    for path, data, error, match in cases:
        if isinstance(data, bytes):
            path.write_bytes(data)
        elif data is not None:
            np.save(path, data)
        bad = dataclasses.replace(rc, data=dataclasses.replace(rc.data, train_windows=str(path), seq_len=SEQ))
        with pytest.raises(error, match=match):
            train(bad, progress=False)
    assert not (tmp_path / "never").exists()


def test_train_windows_from_several_files_are_concatenated(tiny_run, onpolicy, tmp_path):
    from jaxserve.train.trainer import load_windows
    _, _, w = onpolicy
    np.save(tmp_path / "a.npy", w[:3])
    np.save(tmp_path / "b.npy", w[3:])
    rc = dataclasses.replace(tiny_run, data=dataclasses.replace(
        tiny_run.data, train_windows=f"{tmp_path / 'a.npy'},{tmp_path / 'b.npy'}", seq_len=SEQ))
    np.testing.assert_array_equal(load_windows(rc), w)
    bad = dataclasses.replace(rc, data=dataclasses.replace(rc.data, train_windows=f"{tmp_path / 'a.npy'},nope.npy"))
    with pytest.raises(FileNotFoundError, match="nope.npy does not exist"):
        load_windows(bad)
