"""Export to a GGUF file (``gguf.GGUFWriter``), the inverse of ``load_gguf``.

Lets llama.cpp and ``transformers`` (``gguf_file=``) run jaxserve's models on the same weights, and the
tests check the import against files whose contents they know. The layout is the one llama.cpp's
``convert_hf_to_gguf.py`` writes: linear weights ``[out, in]``, Q/K rows permuted for the ``llama``
architecture, Gemma's norm weights stored as ``1 + w``, 1-D tensors (norms, biases) in F32, matrices in
``qtype`` (quantized with ``gguf.quants``).
"""
from __future__ import annotations

import pathlib
from typing import Any

import jax
import numpy as np

from jaxserve.config import ModelConfig
from jaxserve.models.gguf import ARCHITECTURES, gemma3_fixed_fields, gguf_tensor_name

_ARCH = {v: k for k, v in ARCHITECTURES.items()} | {"mixtral": "llama"}


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``permute`` of Q/K rows (the inverse of ``gguf.unpermute_rotary``): w [n_head * D, ...]."""
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, d, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def placeholder_tokenizer(vocab_size: int, eos_token_id: int | None = None) -> dict[str, Any]:
    """GGUF tokenizer metadata for a model without a tokenizer: the 256 byte-level symbols, then
    ``<|extra_i|>`` up to ``vocab_size`` (GGUF readers need a vocabulary of the embedding's size)."""
    from tokenizers import pre_tokenizers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokens = (sorted(alphabet) + [f"<|extra_{i}|>" for i in range(vocab_size)])[:vocab_size]
    types = [1 if t in alphabet else 3 for t in tokens]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": []}
    if eos_token_id is not None:
        meta["tokenizer.ggml.eos_token_id"] = eos_token_id
    return meta


def save_gguf(path: str | pathlib.Path, config: ModelConfig, params: dict, *, qtype: str = "F32",
              tokenizer: dict[str, Any] | None = None) -> pathlib.Path:
    """Writes ``params`` to the new GGUF file ``path``, matrices stored as ``qtype`` (F32, F16, BF16, Q8_0,
    Q4_0, Q4_1, ...: whatever ``gguf.quants.quantize`` implements). ``tokenizer``: GGUF metadata keys
    (``tokenizer.ggml.*``, ``tokenizer.chat_template``) written as they are; default a placeholder vocabulary."""
    import gguf

    path = pathlib.Path(path)
    if path.exists():
        raise ValueError(f"{path} exists; save_gguf writes a new file")
    if config.model_type not in _ARCH:
        raise ValueError(f"cannot export model_type {config.model_type!r} to GGUF; supported: {sorted(_ARCH)}")
    if config.model_type == "gemma3_text":
        _check_gemma3(config)
    quant = gguf.GGMLQuantizationType[qtype]
    arch = _ARCH[config.model_type]
    writer = gguf.GGUFWriter(str(path), arch)
    _write_config(writer, config)
    for key, value in (tokenizer or placeholder_tokenizer(config.vocab_size, config.eos_token_id)).items():
        _add_value(writer, key, value)
    permute = arch == "llama"
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
        leaf_path = tuple(k.key for k in key_path)
        name, transpose = gguf_tensor_name(leaf_path, config.sandwich_norms)
        value = np.asarray(leaf, np.float32)
        if config.norm_unit_offset and leaf_path[-1] == "scale":
            value = value + np.float32(1.0)
        if leaf_path[-1] == "shared_gate":
            value, transpose = value.reshape(1, -1), False
        if transpose:
            value = np.swapaxes(value, -1, -2)
        if permute and leaf_path[-2] in ("q_proj", "k_proj"):
            value = permute_rotary(value, config.num_heads if leaf_path[-2] == "q_proj" else config.num_kv_heads)
        value = np.ascontiguousarray(value)
        if value.ndim == 1 or quant == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, value)
        else:
            writer.add_tensor(name, gguf.quants.quantize(value, quant), raw_dtype=quant)  # shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _check_gemma3(c: ModelConfig) -> None:
    """What llama.cpp fixes for gemma3 instead of storing it must hold, or the file would load as another model."""
    expected = gemma3_fixed_fields(c.num_layers, c.hidden_size, c.num_heads, c.head_dim)
    expected.update(rope_type="default", final_logit_softcap=None)
    for field, value in expected.items():
        if getattr(c, field) != value:
            raise ValueError(f"cannot export this gemma3_text model to GGUF: ModelConfig.{field}="
                             f"{getattr(c, field)!r}, and llama.cpp's gemma3 assumes {value!r}")


def _write_config(writer, c: ModelConfig) -> None:
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    if c.sliding_window is not None:
        writer.add_sliding_window(c.sliding_window)
    if c.bos_token_id is not None:
        writer.add_bos_token_id(c.bos_token_id)
    if c.num_experts:
        writer.add_expert_count(c.num_experts)
        writer.add_expert_used_count(c.num_experts_per_tok)
        writer.add_expert_feed_forward_length(c.expert_intermediate_size)
        if c.num_shared_experts:
            writer.add_expert_shared_feed_forward_length(c.shared_intermediate_size)


def _add_value(writer, key: str, value) -> None:
    import gguf
    if isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, (list, tuple)):
        if value and isinstance(value[0], int) and not isinstance(value[0], bool):
            writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        else:
            writer.add_array(key, list(value))
    else:
        raise ValueError(f"GGUF metadata {key!r}: cannot write a {type(value).__name__}")
