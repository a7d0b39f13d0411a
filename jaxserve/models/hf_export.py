"""Export to a Hugging Face directory (config.json + model.safetensors), the inverse of ``load_hf``.

Lets peer benchmarks and users run jaxserve's models in ``transformers`` on the same weights: dense llama, qwen2
and qwen3, and the MoE families mixtral, qwen2_moe and qwen3_moe (each expert of an ``[E, ...]`` bank written as
HF's per-expert tensor). A config that config.json cannot express exactly is an error naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import numpy as np
from safetensors.numpy import save_file

from jaxserve.config import ModelConfig
from jaxserve.models.hf import config_from_hf, hf_tensor_name

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
         "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
# which attention-bias key each family's config has: qwen2 always has q/k/v biases, mixtral none
_BIAS_KEY = {"llama": "attention_bias", "qwen3": "attention_bias", "qwen3_moe": "attention_bias",
             "qwen2_moe": "qkv_bias"}


def hf_config(config: ModelConfig) -> dict:
    """The config.json dict of ``config``; a ValueError naming the fields it cannot express."""
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
    if config.rope_type != "default":
        out["rope_scaling"] = {"rope_type": config.rope_type, "factor": config.rope_factor}
        if config.rope_type == "llama3":
            out["rope_scaling"].update(low_freq_factor=config.rope_low_freq_factor,
                                       high_freq_factor=config.rope_high_freq_factor,
                                       original_max_position_embeddings=config.rope_original_max_position)
    if config.model_type in _BIAS_KEY:
        out[_BIAS_KEY[config.model_type]] = config.qkv_bias
    out.update(_moe_keys(config))
    _check_reads_back(config, out)
    return out


def _moe_keys(config: ModelConfig) -> dict:
    if config.model_type == "mixtral":  # each expert intermediate_size wide
        return {"num_local_experts": config.num_experts, "num_experts_per_tok": config.num_experts_per_tok}
    if config.model_type not in ("qwen2_moe", "qwen3_moe"):
        return {}
    out = {"num_experts": config.num_experts, "num_experts_per_tok": config.num_experts_per_tok,
           "moe_intermediate_size": config.expert_intermediate_size, "norm_topk_prob": config.norm_topk_prob,
           "decoder_sparse_step": config.moe_layer_freq, "mlp_only_layers": []}
    if config.model_type == "qwen2_moe":  # one sigmoid-gated shared expert
        out["shared_expert_intermediate_size"] = config.shared_intermediate_size
    return out


def _check_reads_back(config: ModelConfig, hf: dict) -> None:
    """``hf`` must say all ``config`` does: ``config_from_hf`` gives ``config`` back (its MoE widths spelled out;
    dtype and matmul_dtype are how to compute, chosen when loading, not part of the checkpoint)."""
    want = config.replace(matmul_dtype=None)
    if config.num_experts:
        want = want.replace(moe_intermediate_size=config.expert_intermediate_size,
                            shared_expert_intermediate_size=config.shared_intermediate_size)
    back = config_from_hf(hf, config.dtype)
    lost = [f"{f.name}={getattr(want, f.name)!r} (it reads back as {getattr(back, f.name)!r})"
            for f in dataclasses.fields(want) if getattr(want, f.name) != getattr(back, f.name)]
    if lost:
        raise ValueError(f"cannot export {config.model_type}: its config.json cannot express {'; '.join(lost)}")


def _hf_tensors(params: dict, model_type: str) -> dict[str, np.ndarray]:
    """HF tensor name -> float32 array, for every leaf of ``params`` (an ``[E, ...]`` bank: one per expert)."""
    tensors = {}
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name, transpose = hf_tensor_name(tuple(k.key for k in key_path), model_type)
        value = np.asarray(leaf, np.float32)
        named = {name.format(e=e): v for e, v in enumerate(value)} if "{e}" in name else {name: value}
        tensors.update((n, np.ascontiguousarray(v.T if transpose else v)) for n, v in named.items())
    return tensors


def save_hf(path: str | pathlib.Path, config: ModelConfig, params: dict) -> pathlib.Path:
    """Writes ``params`` as a float32 HF checkpoint into the new directory ``path`` (nothing is written when the
    config cannot be exported)."""
    hf, tensors = hf_config(config), _hf_tensors(params, config.model_type)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=False)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf, indent=2))
    return path
