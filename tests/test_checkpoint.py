"""Checkpoint round trip is bit-exact; bad checkpoints raise CheckpointError naming the problem."""
import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

from jaxserve.checkpoint import CONFIG_FILE, CheckpointError, load_model, save_model
from jaxserve.models import get_preset, init_params


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = get_preset("tiny-qwen3").replace(dtype="bfloat16")
    params = init_params(config, jax.random.key(3))
    path = save_model(tmp_path_factory.mktemp("ckpt") / "m", config, params)
    return path, config, params


def copy_of(saved, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(saved[0], dst)
    return dst


def test_round_trip_is_bit_exact(saved):
    path, config, params = saved
    config2, params2 = load_model(path)
    assert config2 == config
    leaves, leaves2 = jax.tree.leaves(params), jax.tree.leaves(params2)
    assert jax.tree.structure(params) == jax.tree.structure(params2)
    for a, b in zip(leaves, leaves2):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_refuses_to_overwrite(saved):
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        save_model(saved[0], saved[1], saved[2])


def test_config_not_matching_params(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    fields = dataclasses.asdict(saved[1]) | {"intermediate_size": 100}
    (path / CONFIG_FILE).write_text(json.dumps(fields))
    with pytest.raises(CheckpointError, match=r"\['mlp'\]\['down_proj'\]\['kernel'\] has shape \(176, 64\), config implies \(100, 64\)"):
        load_model(path)


def test_missing_layer(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(saved[1]) | {"num_layers": 3}))
    with pytest.raises(CheckpointError, match="missing params"):
        load_model(path)


@pytest.mark.parametrize("which", ["array data", "everything"])
def test_truncated_files(saved, tmp_path, which):
    path = copy_of(saved, tmp_path)
    files = [f for f in (path / "params").rglob("*") if f.is_file()]
    if which == "array data":
        files = [f for f in files if f.parent.name == "d" and f.parent.parent.name.startswith("ocdbt")]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cannot restore checkpoint"):
        load_model(path)


def test_missing_params_directory(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    shutil.rmtree(path / "params")
    with pytest.raises(CheckpointError):
        load_model(path)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a jaxserve checkpoint"):
        load_model(tmp_path)


def test_invalid_config_json(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / CONFIG_FILE).write_text(json.dumps({"bogus_field": 1}))
    with pytest.raises(CheckpointError, match="not a valid ModelConfig"):
        load_model(path)
