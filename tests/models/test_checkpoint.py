"""Checkpoint round trip is bit-exact; bad checkpoints raise CheckpointError naming the problem."""
import dataclasses
import gc
import json
import shutil

import jax
import numpy as np
import pytest

from jaxserve.models.checkpoint import CONFIG_FILE, MANIFEST_FILE, CheckpointError, load_model, save_model, write_manifest
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
    write_manifest(path)  # re-signed: the shape check below the manifest still catches it
    with pytest.raises(CheckpointError, match=r"\['mlp'\]\['down_proj'\]\['kernel'\] has shape \(176, 64\), config implies \(100, 64\)"):
        load_model(path)


def test_missing_layer(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(saved[1]) | {"num_layers": 3}))
    write_manifest(path)
    with pytest.raises(CheckpointError, match="missing params"):
        load_model(path)


@pytest.mark.parametrize("manifest", [True, False])
@pytest.mark.parametrize("which", ["array data", "everything"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_truncated_files(saved, tmp_path, which, manifest):
    path = copy_of(saved, tmp_path)
    files = [f for f in (path / "params").rglob("*") if f.is_file()]
    if which == "array data":
        files = [f for f in files if f.parent.name == "d" and f.parent.parent.name.startswith("ocdbt")]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    if manifest:
        with pytest.raises(CheckpointError, match=r"params/.* does not match its sha256"):
            load_model(path)
        return
    (path / MANIFEST_FILE).unlink()  # an old checkpoint: orbax's own checks remain
    with pytest.warns(UserWarning, match="no jaxserve_manifest.json"), \
            pytest.raises(CheckpointError, match="cannot restore checkpoint"):
        load_model(path)
    # orbax leaves the failed read's coroutine to the collector: collect it here, where the failure is the point,
    # so that its "exception ignored" is not reported against whichever test the collector next runs in
    gc.collect()


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
    write_manifest(path)
    with pytest.raises(CheckpointError, match="not a valid ModelConfig"):
        load_model(path)


# ---- issue 25: manifest, config binding, atomic save ---------------------------------------------

def all_files(path):
    return sorted(f for f in path.rglob("*") if f.is_file())


def test_manifest_lists_every_file_written(saved):
    path = saved[0]
    listed = json.loads((path / MANIFEST_FILE).read_text())["files"]
    on_disk = {f.relative_to(path).as_posix() for f in all_files(path)} - {MANIFEST_FILE}
    assert set(listed) == on_disk and CONFIG_FILE in listed and any(k.startswith("params/") for k in listed)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_flipped_bit_anywhere_is_named(saved, tmp_path, where):
    """Every file of the checkpoint, its manifest included, one bit at the start, middle and end."""
    path = copy_of(saved, tmp_path)
    rng = np.random.default_rng({"start": 0, "middle": 1, "end": 2}[where])
    files = all_files(path)
    assert len(files) >= 8 and any("ocdbt.process_0/d/" in f.as_posix() for f in files)
    for f in files:
        original = f.read_bytes()
        offset = {"start": 0, "middle": len(original) // 2, "end": len(original) - 1}[where]
        flipped = bytearray(original)
        flipped[offset] ^= 1 << int(rng.integers(8))
        f.write_bytes(bytes(flipped))
        rel = f.relative_to(path).as_posix()
        with pytest.raises(CheckpointError) as e:
            load_model(path)
        assert rel in str(e.value), (rel, str(e.value))
        f.write_bytes(original)
    load_model(path)  # restored: loads again


def test_random_bit_flips_in_the_array_data_never_load(saved, tmp_path):
    """Finding 3's reproducer: before manifests 82 of 100 such flips loaded silently with changed weights."""
    path = copy_of(saved, tmp_path)
    data = [f for f in all_files(path / "params") if f.parent.name == "d"]
    rng = np.random.default_rng(25)
    for _ in range(30):
        f = data[int(rng.integers(len(data)))]
        original = f.read_bytes()
        flipped = bytearray(original)
        flipped[int(rng.integers(len(original)))] ^= 1 << int(rng.integers(8))
        f.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match=f"{f.relative_to(path).as_posix()} does not match its sha256"):
            load_model(path)
        f.write_bytes(original)


def test_config_edit_that_keeps_shapes_is_detected(saved, tmp_path):
    """Heads/head_dim/kv heads 4/32/2 -> 2/64/1 (q/k/v/o shapes kept), rope_theta, eos: loaded silently before."""
    path = copy_of(saved, tmp_path)
    base = dataclasses.asdict(saved[1])
    edits = [dict(num_heads=base["num_heads"] // 2, head_dim=base["head_dim"] * 2, num_kv_heads=base["num_kv_heads"] // 2),
             dict(rope_theta=base["rope_theta"] * 2), dict(eos_token_id=7)]
    for edit in edits:
        (path / CONFIG_FILE).write_text(json.dumps(base | edit, indent=2))
        with pytest.raises(CheckpointError, match=f"{CONFIG_FILE} does not match its sha256"):
            load_model(path)
    # even with the file's entry forged to match, the config hash bound to the params still differs
    body = json.loads((path / MANIFEST_FILE).read_text())
    import hashlib
    body["files"][CONFIG_FILE] = hashlib.sha256((path / CONFIG_FILE).read_bytes()).hexdigest()
    body.pop("manifest_sha256")
    body["manifest_sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (path / MANIFEST_FILE).write_text(json.dumps(body))
    with pytest.raises(CheckpointError, match=f"{CONFIG_FILE} is not the config its params were saved with"):
        load_model(path)


def test_unlisted_and_missing_params_files(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / "params" / "stray").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="params/stray is not listed"):
        load_model(path)
    (path / "params" / "stray").unlink()
    victim = next(f for f in all_files(path / "params") if f.name == "_METADATA")
    victim.unlink()
    with pytest.raises(CheckpointError, match="params/_METADATA is listed in .* but missing"):
        load_model(path)


def test_checkpoint_without_manifest_loads_with_a_warning(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / MANIFEST_FILE).unlink()
    with pytest.warns(UserWarning, match="no jaxserve_manifest.json"):
        config, _ = load_model(path)
    assert config == saved[1]


def test_killed_save_blocks_nothing(saved, tmp_path, monkeypatch):
    _, config, params = saved
    target = tmp_path / "m"
    # a save killed (SIGKILL) half-way left its partial directory behind
    partial = tmp_path / ".m.partial-killed"
    shutil.copytree(saved[0] / "params", partial / "params")
    (partial / CONFIG_FILE).write_text("{")
    # and a save interrupted in-process cleans up after itself, leaving no `m`
    import orbax.checkpoint as ocp

    def interrupted(self, *a, **kw):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(ocp.StandardCheckpointer, "save", interrupted)
        with pytest.raises(KeyboardInterrupt):
            save_model(target, config, params)
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.partial-killed"]
    save_model(target, config, params)
    config2, params2 = load_model(target)
    assert config2 == config
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("name", __import__("jaxserve.zoo", fromlist=["x"]).trained_models())
def test_zoo_checkpoints_carry_a_manifest_that_matches(name):
    from jaxserve.models.checkpoint import verify_manifest
    from jaxserve.zoo import zoo_path
    path = zoo_path(name)
    assert verify_manifest(path)
    listed = json.loads((path / MANIFEST_FILE).read_text())["files"]
    assert "tokenizer.json" in listed and len([k for k in listed if k.startswith("params/")]) >= 6


def test_zoo_model_loads_without_a_warning():
    import warnings
    from jaxserve.zoo import zoo_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config, params = load_model(zoo_path("tiny-code-draft"))
    assert config.vocab_size == params["embed"]["embedding"].shape[0]
