"""Checks a Hugging Face ``config.json`` before it is mapped onto ``ModelConfig``.

``config_from_hf`` reads keys as it needs them; this checks the document's shape first, so a
malformed file is a ``ValueError`` naming the key and the value (``config.json: vocab_size must be
an integer, got '4096' (str)``), not an ``AttributeError``/``KeyError``/``TypeError`` from deep inside.
Only keys that are present are type-checked (which keys a model type requires is
``config_from_hf``'s business; a missing one is reported by ``load_hf``). A nested ``text_config``
(multimodal wrappers) is checked the same way.
"""
from __future__ import annotations

import math
from typing import Any

from jaxserve.validation import is_int

_INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "num_local_experts", "num_experts",
             "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
             "decoder_sparse_step", "sliding_window", "bos_token_id", "pad_token_id")
_POSITIVE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings")
_FLOAT_KEYS = ("rope_theta", "rms_norm_eps")
_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "qkv_bias", "use_sliding_window", "norm_topk_prob")
_DICT_KEYS = ("rope_scaling", "rope_parameters", "quantization_config")


def check_hf_config(hf: Any, where: str = "config.json") -> dict:
    """Returns ``hf`` if it is a well-formed config dict; ``ValueError`` naming the bad key otherwise."""
    if not isinstance(hf, dict):
        raise ValueError(f"{where} must hold a JSON object, got {type(hf).__name__} {_short(hf)}")
    model_type = hf.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"{where}: model_type must be a string, got {_short(model_type)}"
                         if "model_type" in hf else f"{where} lacks the required key 'model_type'")
    _check_keys(hf, where)
    if isinstance(hf.get("text_config"), dict):
        _check_keys(hf["text_config"], f"{where}: text_config")
    return hf


def _check_keys(hf: dict, where: str) -> None:
    for key in _INT_KEYS:
        value = hf.get(key)
        if value is not None and not is_int(value):
            raise ValueError(f"{where}: {key} must be an integer, got {_short(value)} ({type(value).__name__})")
        if key in _POSITIVE_KEYS and value is not None and value <= 0:
            raise ValueError(f"{where}: {key} must be > 0, got {value}")
    eos = hf.get("eos_token_id")
    if eos is not None and not (is_int(eos) or (isinstance(eos, list) and eos and all(is_int(t) for t in eos))):
        raise ValueError(f"{where}: eos_token_id must be an integer or a non-empty list of integers, "
                         f"got {_short(eos)}")
    for key in _FLOAT_KEYS:
        value = hf.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{where}: {key} must be a finite number > 0, got {_short(value)}")
    for key in _BOOL_KEYS:
        value = hf.get(key)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {_short(value)} ({type(value).__name__})")
    for key in _DICT_KEYS:
        value = hf.get(key)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{where}: {key} must be an object or null, got {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
