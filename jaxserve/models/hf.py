"""Hugging Face import: a local directory (config.json + *.safetensors) -> (ModelConfig, params).

Only local paths are read; nothing here touches the network. Supported ``model_type``s: llama (RoPE
unscaled, ``linear`` or ``llama3``), mistral (with or without ``sliding_window``), qwen2, qwen3, gemma3_text
(local/global sliding-window layers), and the MoE families mixtral, qwen2_moe and qwen3_moe (per-expert HF
tensors are stacked into the ``[E, ...]`` expert weights). Every HF tensor is mapped by name onto the params
pytree built from the config, so a missing tensor, an unexpected one or a shape mismatch is an error that names
the tensor.
"""
from __future__ import annotations

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from jaxserve.config import ModelConfig
from jaxserve.models.hf_config_check import check_hf_config
from jaxserve.models.transformer import param_shapes

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "mixtral", "qwen2_moe", "qwen3_moe")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# what HF's config classes default to where a config.json leaves a key out (the others match Llama's)
_DEFAULTS = {"mistral": {"sliding_window": 4096},
             "gemma3_text": {"head_dim": 256, "tie_word_embeddings": True, "max_position_embeddings": 131072,
                             "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": 4096,
                             "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
                             "sliding_window_pattern": 6, "bos_token_id": 2, "eos_token_id": 1}}
_NORMS = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
          "pre_feedforward_norm": "pre_feedforward_layernorm", "post_feedforward_norm": "post_feedforward_layernorm"}
_MOE_BLOCK = {"mixtral": "block_sparse_moe"}  # HF module holding the MoE layer's tensors; default "mlp"
_EXPERT_LEAF = {"mixtral": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}}
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
    """Maps an HF config.json dict onto ModelConfig; unsupported features are errors."""
    model_type = hf.get("model_type")
    if model_type == "deepseek_v3":
        raise ValueError("model_type 'deepseek_v3': multi-head latent attention (MLA) not supported yet; "
                         "its router is available in jaxserve configs as router='deepseek_v3'")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    if hf.get("use_sliding_window"):
        raise ValueError("unsupported: use_sliding_window=true in config.json")
    defaults = _DEFAULTS.get(model_type, {})
    get = lambda key, default=None: hf.get(key, defaults.get(key, default))  # noqa: E731
    heads = hf["num_attention_heads"]
    bias = bool(hf.get("attention_bias", False))
    eos = get("eos_token_id")
    gemma = model_type == "gemma3_text"
    return ModelConfig(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        max_position_embeddings=get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        qkv_bias=True if model_type == "qwen2" else bool(hf.get("qkv_bias", bias)),
        o_bias=False if model_type in ("qwen2", "qwen2_moe") else bias,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        dtype=dtype,
        bos_token_id=get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        hidden_act=_hidden_act(model_type, hf.get("hidden_activation") or get("hidden_act", get("hidden_activation"))),
        **(_gemma3_fields(hf, get) if gemma else _rope_fields(_rope_dict(hf), hf, get("rope_theta", 10000.0), "")),
        **({"sliding_window": get("sliding_window")} if model_type == "mistral" else {}),
        **_moe_fields(model_type, hf),
    )


def _hidden_act(model_type: str, act: str | None) -> str:
    if model_type == "gemma3_text":
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"unsupported hidden_activation {act!r} for gemma3_text (supported: gelu_pytorch_tanh)")
        return "gelu_tanh"
    if act not in (None, "silu", "swish"):
        raise ValueError(f"unsupported hidden_act {act!r} for {model_type} (supported: silu)")
    return "silu"


def _rope_dict(hf: dict) -> dict:
    """The RoPE parameters of a config.json: the legacy ``rope_scaling`` wins over ``rope_parameters``, as in HF."""
    rope = dict(hf.get("rope_parameters") or {})
    return {**rope, **(hf.get("rope_scaling") or {})}


def _rope_fields(rope: dict, hf: dict, default_theta: float, where: str) -> dict:
    """HF RoPE parameters (``rope_type``, ``factor``, ...) -> ModelConfig's rope_* fields."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"unsupported: partial_rotary_factor={partial} in config.json (RoPE on the whole head only)")

    def need(key, default=None):
        value = rope.get(key, default)
        if value is None:
            raise ValueError(f"config.json: rope_type {rope_type!r}{where} needs {key!r} "
                             "in rope_parameters/rope_scaling")
        return value

    fields = dict(rope_theta=float(rope.get("rope_theta", default_theta)))
    if rope_type == "default":
        return fields
    if rope_type == "linear":
        return dict(fields, rope_type="linear", rope_factor=float(need("factor")))
    if rope_type == "llama3":
        return dict(fields, rope_type="llama3", rope_factor=float(need("factor")),
                    rope_low_freq_factor=float(need("low_freq_factor")),
                    rope_high_freq_factor=float(need("high_freq_factor")),
                    rope_original_max_position=int(need("original_max_position_embeddings",
                                                        hf.get("max_position_embeddings"))))
    raise ValueError(f"unsupported rope scaling {rope_type!r}{where} in config.json; supported: {SUPPORTED_ROPE_TYPES}")


def _gemma3_fields(hf: dict, get) -> dict:
    """Gemma 3 text: sliding and full layers, each with its own RoPE; Gemma's norms and scales."""
    if hf.get("use_bidirectional_attention"):
        raise ValueError("unsupported: use_bidirectional_attention=true in config.json (causal attention only)")
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError(f"unsupported: attn_logit_softcapping={hf['attn_logit_softcapping']} in config.json "
                         "(transformers' Gemma 3 attention does not apply it either)")
    layers = hf["num_hidden_layers"]
    pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", get("sliding_window_pattern")))
    layer_types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    params = hf.get("rope_parameters") or {}
    per_type = params if {"full_attention", "sliding_attention"} & set(params) else {"full_attention": params}
    full = {**(per_type.get("full_attention") or {}), **(hf.get("rope_scaling") or {})}
    local = _rope_fields(per_type.get("sliding_attention") or {}, hf, get("rope_local_base_freq"), " (sliding layers)")
    if set(local) != {"rope_theta"}:
        raise ValueError(f"unsupported: scaled RoPE on gemma3 sliding layers ({per_type['sliding_attention']})")
    softcap = hf.get("final_logit_softcapping")
    return dict(**_rope_fields(full, hf, get("rope_theta"), " (full_attention layers)"),
                rope_local_theta=local["rope_theta"], sliding_window=get("sliding_window"),
                layer_types=tuple(layer_types), query_pre_attn_scalar=float(get("query_pre_attn_scalar")),
                norm_unit_offset=True, sandwich_norms=True, scale_embeddings=True,
                final_logit_softcap=None if softcap is None else float(softcap))


def _moe_fields(model_type: str, hf: dict) -> dict:
    if model_type == "mixtral":
        if hf.get("sliding_window"):
            raise ValueError(f"unsupported: sliding_window={hf['sliding_window']} in config.json")
        return dict(num_experts=hf["num_local_experts"], num_experts_per_tok=hf["num_experts_per_tok"],
                    moe_intermediate_size=hf["intermediate_size"], router="mixtral")
    if model_type in ("qwen2_moe", "qwen3_moe"):
        if hf.get("mlp_only_layers"):
            raise ValueError(f"unsupported: mlp_only_layers={hf['mlp_only_layers']} in config.json")
        shared = {} if model_type == "qwen3_moe" else dict(
            num_shared_experts=1, shared_expert_gate=True,
            shared_expert_intermediate_size=hf["shared_expert_intermediate_size"])
        return dict(num_experts=hf.get("num_experts") or hf["num_local_experts"],
                    num_experts_per_tok=hf["num_experts_per_tok"], moe_intermediate_size=hf["moe_intermediate_size"],
                    router="qwen3_moe", norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                    moe_layer_freq=hf.get("decoder_sparse_step", 1), **shared)
    return {}


def hf_tensor_name(path: tuple[str, ...], model_type: str = "llama") -> tuple[str, bool]:
    """Params path -> (HF tensor name, whether the HF tensor is the transposed kernel).

    Stacked expert weights ``[E, ...]`` map to a name with an ``{e}`` placeholder for the expert.
    """
    if path == ("embed", "embedding"):
        return "model.embed_tokens.weight", False
    if path == ("final_norm", "scale"):
        return "model.norm.weight", False
    if path == ("lm_head", "kernel"):
        return "lm_head.weight", True
    layer = int(path[0].removeprefix("layers_"))
    prefix = f"model.layers.{layer}"
    if path[1] in _NORMS:
        return f"{prefix}.{_NORMS[path[1]]}.weight", False
    if path[1] == "mlp" and len(path) == 3:  # MoE block: router and stacked experts
        block = f"{prefix}.{_MOE_BLOCK.get(model_type, 'mlp')}"
        if path[2] in ("router", "shared_gate"):
            return f"{block}.{'gate' if path[2] == 'router' else 'shared_expert_gate'}.weight", True
        return f"{block}.experts.{{e}}.{_EXPERT_LEAF.get(model_type, {}).get(path[2], path[2])}.weight", True
    if path[1] == "mlp" and path[2] == "shared_experts":  # qwen2_moe: one "shared_expert"
        shared = "shared_expert" if model_type == "qwen2_moe" else "shared_experts"
        return f"{prefix}.mlp.{shared}.{path[3]}.weight", True
    block = {"attn": "self_attn", "mlp": "mlp"}[path[1]]
    leaf = {"kernel": "weight", "scale": "weight", "bias": "bias"}[path[3]]
    return f"{prefix}.{block}.{path[2]}.{leaf}", path[3] == "kernel"


INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors dtype names jaxserve reads


def _read_safetensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor, from the file the index names for it (``model.safetensors.index.json``, when
    present: other ``*.safetensors`` files are ignored), else from the one file that holds it (a
    tensor in two files is an error naming both). Only float dtypes are read."""
    where = _tensor_files(directory)
    tensors = {}
    for f in sorted(set(where.values())):
        with _open(f) as sf:
            for name in sf.keys():
                if where.get(name) != f:
                    continue  # the index puts it elsewhere
                dtype = sf.get_slice(name).get_dtype()
                if dtype not in _FLOAT_DTYPES:
                    raise ValueError(f"tensor {name!r} in {f.name} has dtype {dtype}: jaxserve reads float tensors "
                                     f"({', '.join(_FLOAT_DTYPES)}) and no HF quantization format")
                tensors[name] = sf.get_tensor(name)
    return tensors


def _open(f: pathlib.Path):
    try:
        return safe_open(f, framework="flax")
    except Exception as e:  # safetensors' own error type for a truncated or foreign file
        raise ValueError(f"{f} is not a readable safetensors file ({type(e).__name__}: {e})") from None


def _tensor_files(directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """Tensor name -> the safetensors file to read it from."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            where = {name: directory / file for name, file in weight_map.items()}
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index} is not a safetensors index ({type(e).__name__}: {e})") from None
        for name, f in where.items():
            if not f.is_file():
                raise ValueError(f"{index} puts tensor {name!r} in {f.name}, which does not exist")
        for f in sorted(set(where.values())):
            with _open(f) as sf:
                held = set(sf.keys())
            missing = sorted(n for n, g in where.items() if g == f and n not in held)
            if missing:
                raise ValueError(f"{index} puts tensor {missing[0]!r} in {f.name}, which does not hold it")
        return where
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {directory}")
    where = {}
    for f in files:
        with _open(f) as sf:
            for name in sf.keys():
                if name in where:
                    raise ValueError(f"tensor {name!r} is in both {where[name].name} and {f.name} (and there is no "
                                     f"{INDEX_FILE} to say which to use): remove the stale file")
                where[name] = f
    return where


def _config(file: pathlib.Path, dtype: str) -> ModelConfig:
    try:
        hf = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    check_hf_config(hf, str(file))
    try:
        return config_from_hf(hf, dtype)
    except KeyError as e:
        raise ValueError(f"{file} lacks the required key {e.args[0]!r}") from None
    except (TypeError, AttributeError) as e:  # a value of a shape the checks above do not know
        raise ValueError(f"{file} has a malformed value: {type(e).__name__}: {e}") from None


def load_hf(path: str | pathlib.Path, dtype: str = "float32") -> tuple[ModelConfig, dict]:
    """Reads a local HF model directory into ``(ModelConfig, params)`` in ``dtype``."""
    directory = pathlib.Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} is not a Hugging Face model directory (no config.json)")
    config = _config(directory / "config.json", dtype)
    tensors = _read_safetensors(directory)
    expected = param_shapes(config)
    used = set()

    def load_leaf(key_path, shape_dtype):
        path = tuple(k.key for k in key_path)
        name, transpose = hf_tensor_name(path, config.model_type)
        stacked = "{e}" in name
        names = [name.format(e=e) for e in range(config.num_experts)] if stacked else [name]
        values = []
        for name in names:
            if name not in tensors:
                raise ValueError(f"checkpoint {directory} is missing tensor {name!r} (for params {'/'.join(path)})")
            value = jnp.asarray(tensors[name])
            values.append(value.T if transpose else value)
            used.add(name)
        value = jnp.stack(values) if stacked else values[0]
        if value.shape != shape_dtype.shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(tensors[name].shape)}, expected "
                             f"{shape_dtype.shape[-2:][::-1] if transpose else shape_dtype.shape} for this config")
        return value.astype(shape_dtype.dtype)

    params = jax.tree_util.tree_map_with_path(load_leaf, expected)
    unexpected = sorted(n for n in tensors if n not in used and not _IGNORED.match(n)
                        and not (config.tie_word_embeddings and n == "lm_head.weight"))
    if unexpected:
        raise ValueError(f"checkpoint {directory} has tensors this model does not use: {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
    return config, params
