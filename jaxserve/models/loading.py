"""Resolving a model name to (config, params, tokenizer): zoo name, GGUF file, jaxserve checkpoint, or HF dir."""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp

from jaxserve.models.checkpoint import is_checkpoint, load_model
from jaxserve.models.hf import load_hf
from jaxserve.models.transformer import param_shapes
from jaxserve.tokenizer import TOKENIZER_FILE, load_tokenizer

ZOO_PREFIX = "jaxserve/"


def model_path(model: str) -> pathlib.Path:
    """The local directory behind ``model`` (a zoo name resolves to the package data)."""
    from jaxserve.zoo import is_packaged, zoo_path  # the zoo is package data
    path = pathlib.Path(model)
    if not path.exists() and (model.startswith(ZOO_PREFIX) or is_packaged(model)):
        path = zoo_path(model.removeprefix(ZOO_PREFIX))
    return path


def resolve_model(model: str, dtype: str | None = None, matmul_dtype: str | None = None):
    """Returns ``(config, params, tokenizer or None)``; only local files are ever read.

    ``model`` is ``"jaxserve/<zoo name>"``, a packaged real model (``"smollm2-135m-instruct"``), a local GGUF
    file (``*.gguf``: weights, tokenizer and chat template in one file), a jaxserve checkpoint directory, or a
    local Hugging Face directory (config.json + *.safetensors, tokenizer.json and tokenizer_config.json for
    text prompts and chat). ``dtype`` casts the params and activations;
    ``matmul_dtype`` sets ``ModelConfig.matmul_dtype`` (the Dense layers' dot operands, float32 sums).
    """
    path = model_path(model)
    tokenizer = None
    if path.suffix == ".gguf" and path.is_file():
        config, params, tokenizer = load_gguf_model(path, dtype or "float32")
    elif is_checkpoint(path):
        config, params = load_model(path)
        if dtype is not None and dtype != config.dtype:
            config = config.replace(dtype=dtype)
            params = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
    elif (path / "config.json").is_file():
        config, params = load_hf(path, dtype or "float32")
    else:
        raise ValueError(f"model {model!r} is not a zoo name ('{ZOO_PREFIX}<name>'), a GGUF file, a jaxserve "
                         "checkpoint directory or a local Hugging Face directory")
    if matmul_dtype is not None:
        config, params = with_matmul_dtype(config, params, matmul_dtype)
    if tokenizer is None and (path / TOKENIZER_FILE).is_file():
        tokenizer = load_tokenizer(path)
    return config, to_device(params), tokenizer


def load_gguf_model(path: pathlib.Path, dtype: str = "float32"):
    """``(config, params, tokenizer)`` of a GGUF file, its metadata read once for both."""
    from jaxserve.models.gguf import load_gguf
    from jaxserve.tokenizer_gguf import tokenizer_from_gguf
    config, params, meta = load_gguf(path, dtype, with_metadata=True)
    return config, params, tokenizer_from_gguf(meta)


def with_matmul_dtype(config, params, matmul_dtype: str | None):
    """``config`` with ``matmul_dtype`` set, and ``params`` with every leaf in the dtype the model declares
    for it under that setting (Dense kernels in the narrower of dtype and matmul_dtype, the rest as before)."""
    config = config.replace(matmul_dtype=matmul_dtype)
    return config, jax.tree.map(lambda x, s: x.astype(s.dtype), params, param_shapes(config))


def widen_mlp(config, params, intermediate: int):
    """``(config, params)`` with every MLP widened to ``intermediate`` by zero weights: the same function
    (silu(0) * 0 = 0 through new rows of down_proj that are 0), more bytes and FLOPs a step.

    A stand-in for a larger target with the same tokens, so that speculative decoding is measured where
    the target's weights no longer fit in a CPU's caches while the draft keeps its real acceptance
    (``benchmarks/RESULTS.md``). Dense models only.
    """
    if config.num_experts:
        raise ValueError(f"widen_mlp widens dense MLPs; this model has num_experts={config.num_experts}")
    width = intermediate - config.intermediate_size
    if width < 0:
        raise ValueError(f"intermediate {intermediate} is below the model's intermediate_size "
                         f"{config.intermediate_size}")

    def widen(path, x):
        names = {getattr(k, "key", None) for k in path}
        if "mlp" not in names:
            return x
        if names & {"gate_proj", "up_proj"}:  # kernel [E, I] (and a bias [I], if any): new outputs
            return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width)])
        if x.ndim == 2:  # down_proj's kernel [I, E]: new inputs
            return jnp.pad(x, ((0, width), (0, 0)))
        return x
    return config.replace(intermediate_size=intermediate), jax.tree_util.tree_map_with_path(widen, params)


def to_device(params):
    """Params as device arrays. Orbax restores numpy arrays, and a jitted call copies every numpy
    argument to the device on every call: for tiny-code (26 MB) ~6 ms per engine step, more
    than the batch-1 decode step itself (~1.4 ms). A no-op for arrays already on the device."""
    return jax.device_put(params)
