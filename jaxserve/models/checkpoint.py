"""jaxserve model checkpoints: params with orbax, the config as JSON beside them.

Layout of a checkpoint directory::

    jaxserve_config.json     the ModelConfig fields
    params/                  an orbax StandardCheckpointer tree
    tokenizer.json           optional, copied in by the caller (as are router_state.json, token_counts.json)
    jaxserve_manifest.json   sha256 of every file above and of the config's fields, and of itself

Restoring first checks the manifest: a flipped bit in any listed file, a file missing from
``params/`` or one there that the manifest does not list, or an edited config (one that keeps the
param shapes included) raises ``CheckpointError`` naming the file. It then checks the stored tree
against the shapes the config implies, so a checkpoint that does not match its config, or one that
is truncated or corrupt, raises ``CheckpointError`` instead of loading partially.

A checkpoint without a manifest (written before manifests existed) still loads, with a
``UserWarning`` that its integrity cannot be checked; ``write_manifest(path)`` adds one.

``save_model`` is atomic: it writes into a fresh temporary sibling directory and renames it to
``path`` when complete, so a save killed half-way leaves only a ``.<name>.partial-*`` directory,
which blocks nothing (delete it at leisure).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import warnings

import jax
import orbax.checkpoint as ocp

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import param_shapes

CONFIG_FILE = "jaxserve_config.json"
PARAMS_DIR = "params"
MANIFEST_FILE = "jaxserve_manifest.json"
# read when the checkpoint is served: listed in the manifest when present
SERVED_FILES = ("tokenizer.json", "tokenizer_config.json", "router_state.json", "token_counts.json")
_MANIFEST_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored as asked (missing, corrupt, or not matching its config)."""


def is_checkpoint(path: str | pathlib.Path) -> bool:
    return (pathlib.Path(path) / CONFIG_FILE).is_file()


def save_model(path: str | pathlib.Path, config: ModelConfig, params: dict) -> pathlib.Path:
    """Writes ``params``, ``config`` and their manifest to a new directory ``path`` (which must not
    exist), atomically: all is written to a temporary sibling directory, renamed to ``path`` at the end."""
    path = pathlib.Path(path).absolute()
    if path.exists():
        raise CheckpointError(f"refusing to overwrite existing path {path}")
    _check_tree(params, param_shapes(config), path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=2))
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(tmp / PARAMS_DIR, params)
        write_manifest(tmp)
        if path.exists():  # appeared while we wrote
            raise CheckpointError(f"refusing to overwrite existing path {path}")
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def write_manifest(path: str | pathlib.Path) -> pathlib.Path:
    """(Re)writes ``path/jaxserve_manifest.json``: the sha256 of the config, of every file under
    ``params/`` and of the ``SERVED_FILES`` present. Call it after adding a tokenizer to a checkpoint."""
    path = pathlib.Path(path)
    files = {rel: _sha256(path / rel) for rel in _covered_files(path)}
    body = {"format": _MANIFEST_FORMAT, "config_sha256": _config_hash(path / CONFIG_FILE), "files": files}
    body["manifest_sha256"] = _digest(body)
    tmp = path / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path / MANIFEST_FILE)
    return path / MANIFEST_FILE


def verify_manifest(path: str | pathlib.Path) -> bool:
    """Checks every file against the manifest; ``CheckpointError`` naming the first file that differs.

    Returns False (and warns) for a checkpoint without a manifest, True when everything matches."""
    path = pathlib.Path(path)
    if not (path / MANIFEST_FILE).is_file():
        warnings.warn(f"checkpoint {path} has no {MANIFEST_FILE}: its integrity cannot be checked "
                      "(jaxserve.models.checkpoint.write_manifest adds one)", UserWarning, stacklevel=3)
        return False
    files, config_hash = _read_manifest(path)
    for rel, want in files.items():
        if not (path / rel).is_file():
            raise CheckpointError(f"checkpoint {path}: {rel} is listed in {MANIFEST_FILE} but missing")
        if _sha256(path / rel) != want:
            raise CheckpointError(f"checkpoint {path}: {rel} does not match its sha256 in {MANIFEST_FILE} "
                                  "(corrupt or modified after saving)")
    extra = sorted(set(_covered_files(path)) - set(files))
    if extra:
        raise CheckpointError(f"checkpoint {path}: {extra[0]} is not listed in {MANIFEST_FILE} "
                              f"({len(extra)} unlisted file(s))")
    if _config_hash(path / CONFIG_FILE) != config_hash:
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} is not the config its params were saved with")
    return True


def _read_manifest(path: pathlib.Path) -> tuple[dict[str, str], str]:
    where = f"checkpoint {path}: {MANIFEST_FILE}"
    try:
        body = json.loads((path / MANIFEST_FILE).read_bytes().decode("utf-8"))
        claimed = body.pop("manifest_sha256")
        files, config_hash = body["files"], body["config_sha256"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{where} is corrupt ({type(e).__name__}: {e})") from None
    if claimed != _digest(body):
        raise CheckpointError(f"{where} does not match its own sha256 (corrupt or modified)")
    if body.get("format") != _MANIFEST_FORMAT:
        raise CheckpointError(f"{where} has format {body.get('format')!r}; this jaxserve reads {_MANIFEST_FORMAT}")
    return files, config_hash


def _covered_files(path: pathlib.Path) -> list[str]:
    params = sorted(p.relative_to(path).as_posix() for p in (path / PARAMS_DIR).rglob("*") if p.is_file())
    return [CONFIG_FILE] + params + [f for f in SERVED_FILES if (path / f).is_file()]


def _sha256(file: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _config_hash(config_file: pathlib.Path) -> str:
    """Of the stored fields (not of today's ModelConfig defaults: a new field must not break old checkpoints)."""
    try:
        return _digest(json.loads(config_file.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{config_file} is unreadable ({type(e).__name__}: {e})") from None


def load_config(path: str | pathlib.Path) -> ModelConfig:
    path = pathlib.Path(path)
    try:
        fields = json.loads((path / CONFIG_FILE).read_text())
        return ModelConfig(**fields)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a jaxserve checkpoint (no {CONFIG_FILE})") from None
    except (json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"{path / CONFIG_FILE} is not a valid ModelConfig: {e}") from None


def load_model(path: str | pathlib.Path) -> tuple[ModelConfig, dict]:
    """Restores ``(config, params)`` bit-exactly; raises ``CheckpointError`` on any mismatch.

    The manifest is checked first (see the module docstring); a checkpoint without one loads with a
    ``UserWarning``."""
    path = pathlib.Path(path).absolute()
    if not (path / CONFIG_FILE).is_file():
        raise CheckpointError(f"{path} is not a jaxserve checkpoint (no {CONFIG_FILE})")
    verify_manifest(path)
    config = load_config(path)
    expected = param_shapes(config)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            stored = ckptr.metadata(path / PARAMS_DIR)
            stored = getattr(stored, "item_metadata", stored)
            if not jax.tree.leaves(stored):
                raise CheckpointError(f"cannot restore checkpoint {path}: its metadata is missing or "
                                      "unreadable (truncated or corrupt?)")
            _check_tree(stored, expected, path)
            target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), expected)
            return config, ckptr.restore(path / PARAMS_DIR, target)
    except CheckpointError:
        raise
    except Exception as e:  # orbax/tensorstore raise many types for truncated or corrupt files
        raise CheckpointError(f"cannot restore checkpoint {path}: {type(e).__name__}: {e}") from None


def _check_tree(tree, expected, path) -> None:
    got = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(tree)}
    want = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(expected)}
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    if missing or extra:
        raise CheckpointError(f"checkpoint {path} does not match its config: missing params {missing[:4]}, "
                              f"unexpected params {extra[:4]}")
    for k, shape in want.items():
        if got[k] != shape:
            raise CheckpointError(f"checkpoint {path}: params {k} has shape {got[k]}, config implies {shape}")
