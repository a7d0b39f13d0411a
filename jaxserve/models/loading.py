"""Resolving a model name to (config, params, tokenizer): zoo name, jaxserve checkpoint, or HF dir."""
from __future__ import annotations

import pathlib

from jaxserve.checkpoint import is_checkpoint, load_model
from jaxserve.models.hf import load_hf
from jaxserve.tokenizer import TOKENIZER_FILE, load_tokenizer

ZOO_PREFIX = "jaxserve/"


def model_path(model: str) -> pathlib.Path:
    """The local directory behind ``model`` (a zoo name resolves to the package data)."""
    path = pathlib.Path(model)
    if model.startswith(ZOO_PREFIX) and not path.exists():
        from jaxserve.zoo import zoo_path  # the zoo is package data
        path = zoo_path(model[len(ZOO_PREFIX):])
    return path


def resolve_model(model: str, dtype: str | None = None):
    """Returns ``(config, params, tokenizer or None)``; only local files are ever read.

    ``model`` is ``"jaxserve/<zoo name>"``, a jaxserve checkpoint directory, or a local Hugging
    Face directory (config.json + *.safetensors).
    """
    path = model_path(model)
    if is_checkpoint(path):
        config, params = load_model(path)
        if dtype is not None and dtype != config.dtype:
            import jax
            import jax.numpy as jnp
            config = config.replace(dtype=dtype)
            params = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
    elif (path / "config.json").is_file():
        config, params = load_hf(path, dtype or "float32")
    else:
        raise ValueError(f"model {model!r} is not a zoo name ('{ZOO_PREFIX}<name>'), a jaxserve checkpoint "
                         "directory or a local Hugging Face directory")
    tokenizer = load_tokenizer(path) if (path / TOKENIZER_FILE).is_file() else None
    return config, params, tokenizer
