"""jaxserve model checkpoints: params with orbax, the config as JSON beside them.

Layout of a checkpoint directory::

    jaxserve_config.json   the ModelConfig fields
    params/                an orbax StandardCheckpointer tree
    tokenizer.json         optional, copied in by the caller

Restoring checks the stored tree against the shapes the config implies, so a checkpoint that
does not match its config, or one that is truncated or corrupt, raises ``CheckpointError``
instead of loading partially.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import orbax.checkpoint as ocp

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import param_shapes

CONFIG_FILE = "jaxserve_config.json"
PARAMS_DIR = "params"


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored as asked (missing, corrupt, or not matching its config)."""


def is_checkpoint(path: str | pathlib.Path) -> bool:
    return (pathlib.Path(path) / CONFIG_FILE).is_file()


def save_model(path: str | pathlib.Path, config: ModelConfig, params: dict) -> pathlib.Path:
    """Writes ``params`` and ``config`` to a new directory ``path`` (which must not exist)."""
    path = pathlib.Path(path).absolute()
    if path.exists():
        raise CheckpointError(f"refusing to overwrite existing path {path}")
    _check_tree(params, param_shapes(config), path)
    path.mkdir(parents=True)
    (path / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=2))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path / PARAMS_DIR, params)
    return path


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
    """Restores ``(config, params)`` bit-exactly; raises ``CheckpointError`` on any mismatch."""
    path = pathlib.Path(path).absolute()
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
