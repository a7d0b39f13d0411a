"""Export to a Hugging Face directory (config.json + model.safetensors), the inverse of ``load_hf``.

Lets peer benchmarks and users run jaxserve's zoo models in ``transformers`` on the same weights.
"""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
from safetensors.numpy import save_file

from jaxserve.config import ModelConfig
from jaxserve.models.hf import hf_tensor_name

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config(config: ModelConfig) -> dict:
    if config.model_type not in _ARCH:
        raise ValueError(f"cannot export model_type {config.model_type!r}; supported: {sorted(_ARCH)}")
    out = {"architectures": [_ARCH[config.model_type]], "model_type": config.model_type,
           "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
           "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
           "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
           "head_dim": config.head_dim, "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
           "max_position_embeddings": config.max_position_embeddings,
           "tie_word_embeddings": config.tie_word_embeddings, "hidden_act": "silu",
           "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id, "torch_dtype": "float32"}
    unexportable = {k: getattr(config, k) for k in ("sliding_window", "rope_local_theta", "query_pre_attn_scalar",
                                                   "final_logit_softcap") if getattr(config, k) is not None}
    if unexportable or config.sandwich_norms or config.scale_embeddings or config.norm_unit_offset:
        raise ValueError(f"cannot export {config.model_type} with {unexportable or 'Gemma-style norms/embeddings'}")
    if config.rope_type != "default":
        out["rope_scaling"] = {"rope_type": config.rope_type, "factor": config.rope_factor}
        if config.rope_type == "llama3":
            out["rope_scaling"].update(low_freq_factor=config.rope_low_freq_factor,
                                       high_freq_factor=config.rope_high_freq_factor,
                                       original_max_position_embeddings=config.rope_original_max_position)
    if config.model_type != "qwen2":
        if config.qkv_bias != config.o_bias:
            raise ValueError(f"{config.model_type} cannot express qkv_bias={config.qkv_bias} with o_bias={config.o_bias}")
        out["attention_bias"] = config.qkv_bias
    elif not config.qkv_bias or config.o_bias:
        raise ValueError("qwen2 models have q/k/v biases and no o_proj bias")
    return out


def save_hf(path: str | pathlib.Path, config: ModelConfig, params: dict) -> pathlib.Path:
    """Writes ``params`` as a float32 HF checkpoint into the new directory ``path``."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=False)
    tensors = {}
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name, transpose = hf_tensor_name(tuple(k.key for k in key_path))
        value = np.asarray(leaf, np.float32)
        tensors[name] = np.ascontiguousarray(value.T if transpose else value)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf_config(config), indent=2))
    return path
