"""GGUF import (llama.cpp's model file): ``load_gguf(path) -> (ModelConfig, params)``.

Parsing and dequantization are the ``gguf`` package's (``GGUFReader``, ``gguf.quants.dequantize``);
this module maps llama.cpp's metadata keys onto ``ModelConfig`` and its tensor names onto the params
pytree, and undoes the one transform llama.cpp's converter applies to weights: for the ``llama``
architecture the rows of Q and K are permuted so that RoPE can rotate adjacent pairs (GPT-J style);
jaxserve, like Hugging Face, rotates halves (GPT-NeoX style). For ``gemma3`` Q/K are not permuted, but every
RMSNorm weight is stored as ``1 + w`` (Gemma scales by ``1 + w``; llama.cpp folds the 1 in), so 1 is taken
off again and the config keeps ``norm_unit_offset``, as for the Hugging Face checkpoint.

Supported architectures: ``llama`` (Llama, Mistral without sliding window, SmolLM, Mixtral when it has
experts), ``qwen2``, ``qwen3``, ``qwen2moe``, ``qwen3moe``, ``gemma3`` (text). Every tensor is mapped by name,
so a missing or unexpected tensor, a shape that does not fit the metadata, a quantization type the ``gguf``
package cannot dequantize, or a truncated file is a ``GGUFError`` naming it.
"""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import param_shapes

# GGUF architecture -> jaxserve/HF model_type (MoE variants are chosen from the expert count)
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe",
                 "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}
# The quantization types the loader accepts: every one ``gguf.quants`` dequantizes in NumPy.
_FLOAT_TYPES = ("F32", "F16", "BF16")

_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_MLP = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
_NORMS = {"input_norm": "attn_norm", "post_attention_norm": "ffn_norm"}  # without sandwich norms
_SANDWICH_NORMS = {"input_norm": "attn_norm", "post_attention_norm": "post_attention_norm",
                   "pre_feedforward_norm": "ffn_norm", "post_feedforward_norm": "post_ffw_norm"}
# What llama.cpp fixes for gemma3 rather than writing to the metadata (llama-model.cpp): every 6th layer
# attends globally, the sliding layers' RoPE base is 10000, and the attention scale is 1/sqrt(head_dim)
# except for the 27B model (62 layers), where it is 1/sqrt(hidden / heads).
_GEMMA3_PATTERN, _GEMMA3_LOCAL_THETA, _GEMMA3_27B_LAYERS = 6, 10_000.0, 62


class GGUFError(ValueError):
    """A GGUF file jaxserve cannot load; the message names the file and what is wrong."""


def read_gguf(path: str | pathlib.Path):
    """The ``gguf.GGUFReader`` of ``path``, with every tensor checked to lie inside the file."""
    import gguf  # a core dependency, imported late: only GGUF users pay for it

    path = pathlib.Path(path)
    if not path.is_file():
        raise GGUFError(f"no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError / IndexError / struct errors on garbage
        raise GGUFError(f"{path} is not a readable GGUF file: truncated or corrupt ({type(e).__name__}: {e})") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise GGUFError(f"{path} is truncated: tensor {t.name!r} needs bytes up to "
                            f"{t.data_offset + t.n_bytes}, the file has {size}")
    return reader


def metadata(reader) -> dict:
    """Every metadata key with its value (arrays as lists), as the ``gguf`` package decodes them."""
    return {name: field.contents() for name, field in reader.fields.items()}


def config_from_gguf(meta: dict, tensor_names: set[str], dtype: str = "float32") -> ModelConfig:
    """Maps llama.cpp's metadata (``{arch}.block_count`` ...) onto ``ModelConfig``."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(ARCHITECTURES)}")

    def get(key, default=None, required=True):
        value = meta.get(f"{arch}.{key}", default)
        if value is None and required:
            raise GGUFError(f"GGUF metadata lacks {arch}.{key}")
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise GGUFError(f"GGUF metadata {arch}.{key}={value}: per-layer values are not supported")
            value = value[0]
        return value

    _reject_unsupported(arch, meta, tensor_names, get)
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    experts = int(get("expert_count", 0))
    model_type = "mixtral" if arch == "llama" and experts else ARCHITECTURES[arch]
    vocab = get("vocab_size", len(meta.get("tokenizer.ggml.tokens") or []) or None)
    return ModelConfig(
        model_type=model_type, vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length", 0, required=not experts) or
                              get("expert_feed_forward_length")),
        num_layers=int(get("block_count")), num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rope_theta=_decimal(get("rope.freq_base", 10000.0)),
        rms_norm_eps=_decimal(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names, o_bias="blk.0.attn_output.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names, dtype=dtype,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        **(_gemma3_fields(meta, get) if arch == "gemma3" else {}),
        **_moe_fields(model_type, experts, get, tensor_names))


def gemma3_fixed_fields(layers: int, hidden: int, heads: int, head_dim: int, pattern=None) -> dict:
    """The ``ModelConfig`` fields of a gemma3 GGUF that llama.cpp fixes rather than reads (``pattern``: the
    optional ``gemma3.attention.sliding_window_pattern``, per-layer booleans or a period)."""
    if isinstance(pattern, list):  # per layer, true where the layer slides
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern or _GEMMA3_PATTERN)) for i in range(layers)]
    if len(sliding) != layers:
        raise GGUFError(f"GGUF metadata gemma3.attention.sliding_window_pattern has {len(sliding)} entries "
                        f"for {layers} layers")
    return dict(layer_types=tuple("sliding_attention" if s else "full_attention" for s in sliding),
                rope_local_theta=_GEMMA3_LOCAL_THETA,
                query_pre_attn_scalar=float(hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim),
                hidden_act="gelu_tanh", norm_unit_offset=True, sandwich_norms=True, scale_embeddings=True)


def _gemma3_fields(meta: dict, get) -> dict:
    """Gemma 3's local/global layers, norms, scales and activation (``jaxserve.models.hf`` maps the same from
    a config.json)."""
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    softcap = get("final_logit_softcapping", None, required=False)
    head_dim = int(get("attention.key_length", hidden // heads))
    fixed = gemma3_fixed_fields(int(get("block_count")), hidden, heads, head_dim,
                                meta.get("gemma3.attention.sliding_window_pattern"))
    return dict(fixed, sliding_window=int(get("attention.sliding_window")),
                final_logit_softcap=None if softcap is None else _decimal(softcap))


def _decimal(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06): the
    value the model's own config.json had before conversion."""
    return float(str(np.float32(value)))


def _reject_unsupported(arch, meta, tensor_names, get):
    scaling = get("rope.scaling.type", "none", required=False)
    if scaling not in (None, "none"):
        raise GGUFError(f"GGUF metadata {arch}.rope.scaling.type={scaling!r}: only unscaled RoPE is supported")
    if "rope_freqs.weight" in tensor_names:
        raise GGUFError("GGUF tensor 'rope_freqs.weight' (Llama 3 rope frequency factors) is not supported yet")
    window = get("attention.sliding_window", None, required=False)
    if window and arch != "gemma3":
        raise GGUFError(f"GGUF metadata {arch}.attention.sliding_window={window} is not supported yet")
    rotary = get("rope.dimension_count", None, required=False)
    head_dim = get("attention.key_length", None, required=False) or get("embedding_length") // get("attention.head_count")
    if rotary is not None and rotary != head_dim:
        raise GGUFError(f"GGUF metadata {arch}.rope.dimension_count={rotary} (head dim {head_dim}): "
                        "partial rotary embeddings are not supported")


def _moe_fields(model_type: str, experts: int, get, tensor_names: set[str]) -> dict:
    if not experts:
        return {}
    fields = dict(num_experts=experts, num_experts_per_tok=int(get("expert_used_count")),
                  moe_intermediate_size=int(get("expert_feed_forward_length", 0, required=False) or
                                            get("feed_forward_length")))
    if model_type == "mixtral":
        return dict(fields, router="mixtral")
    fields.update(router="qwen3_moe", norm_topk_prob=model_type == "qwen3_moe")
    if "blk.0.ffn_up_shexp.weight" in tensor_names:
        fields.update(num_shared_experts=1, shared_expert_gate="blk.0.ffn_gate_inp_shexp.weight" in tensor_names,
                      shared_expert_intermediate_size=int(get("expert_shared_feed_forward_length")))
    return fields


def gguf_tensor_name(path: tuple[str, ...], sandwich_norms: bool = False) -> tuple[str, bool]:
    """Params path -> (GGUF tensor name, whether the stored tensor is the transposed kernel).

    GGUF stores linear weights as HF does, ``[out, in]`` (row-major, in the NumPy view of the data), and
    stacked experts as ``[E, out, in]``; jaxserve's kernels are ``[in, out]``. With ``sandwich_norms``
    (Gemma) a layer has four norms, and ``ffn_norm`` is the one before the MLP.
    """
    if path == ("embed", "embedding"):
        return "token_embd.weight", False
    if path == ("final_norm", "scale"):
        return "output_norm.weight", False
    if path == ("lm_head", "kernel"):
        return "output.weight", True
    block = f"blk.{int(path[0].removeprefix('layers_'))}"
    norms = _SANDWICH_NORMS if sandwich_norms else _NORMS
    if path[1] in norms:
        return f"{block}.{norms[path[1]]}.weight", False
    if path[1] == "attn":
        if path[2] in ("q_norm", "k_norm"):
            return f"{block}.attn_{path[2]}.weight", False
        return f"{block}.{_ATTN[path[2]]}.{'weight' if path[3] == 'kernel' else 'bias'}", path[3] == "kernel"
    if len(path) == 3:  # an MoE block: router, shared gate, stacked experts
        if path[2] in ("router", "shared_gate"):
            return f"{block}.ffn_gate_inp{'_shexp' if path[2] == 'shared_gate' else ''}.weight", True
        return f"{block}.{_MLP[path[2]]}_exps.weight", True
    if path[2] == "shared_experts":
        return f"{block}.{_MLP[path[3]]}_shexp.weight", True
    return f"{block}.{_MLP[path[2]]}.weight", True


def dequantize(tensor) -> np.ndarray:
    """A ``gguf.ReaderTensor`` as float32 in its logical NumPy shape (GGUF's dims reversed)."""
    import gguf

    qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
    if qtype.name not in _FLOAT_TYPES and qtype not in gguf.quants._type_traits:
        raise GGUFError(f"tensor {tensor.name!r} is stored as {qtype.name}, which gguf.quants cannot dequantize")
    shape = tuple(int(d) for d in reversed(tensor.shape))
    data = tensor.data if qtype.name in ("F32", "F16") else tensor.data.view(np.uint8)  # the reader types BF16 u16
    return gguf.quants.dequantize(data, qtype).astype(np.float32, copy=False).reshape(shape)


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's ``permute`` of Q/K rows (``convert_hf_to_gguf.py``): w [n_head * D, ...]."""
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | pathlib.Path, dtype: str = "float32", with_metadata: bool = False):
    """Reads a local GGUF file into ``(ModelConfig, params)``, every weight dequantized and cast to ``dtype``
    (``(ModelConfig, params, metadata)`` with ``with_metadata``: the tokenizer is built from it)."""
    reader = read_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    meta = metadata(reader)
    config = config_from_gguf(meta, set(tensors), dtype)
    permute = config.model_type in ("llama", "mixtral")
    used = set()

    def load_leaf(key_path, shape_dtype):
        leaf = tuple(k.key for k in key_path)
        name, transpose = gguf_tensor_name(leaf, config.sandwich_norms)
        if name not in tensors:
            raise GGUFError(f"GGUF file {path} is missing tensor {name!r} (for params {'/'.join(leaf)})")
        used.add(name)
        value = dequantize(tensors[name])
        if permute and leaf[-2:] in (("q_proj", "kernel"), ("q_proj", "bias")):
            value = unpermute_rotary(value, config.num_heads)
        elif permute and leaf[-2:] in (("k_proj", "kernel"), ("k_proj", "bias")):
            value = unpermute_rotary(value, config.num_kv_heads)
        if config.norm_unit_offset and leaf[-1] == "scale":  # stored as 1 + w (see the module docstring)
            value = value - np.float32(1.0)
        if leaf[-1] == "shared_gate":  # [1, E] or [E] in the file, [E, 1] here
            value = value.reshape(shape_dtype.shape)
        elif transpose:
            value = np.swapaxes(value, -1, -2)
        if value.shape != shape_dtype.shape:
            raise GGUFError(f"GGUF tensor {name!r} has shape {value.shape}{' (transposed)' if transpose else ''}, "
                            f"expected {shape_dtype.shape} for the config in its metadata")
        return jnp.asarray(value, shape_dtype.dtype)

    params = jax.tree_util.tree_map_with_path(load_leaf, param_shapes(config))
    unexpected = sorted(set(tensors) - used)
    if unexpected:
        raise GGUFError(f"GGUF file {path} has tensors this model does not use: {unexpected[:5]}"
                        f"{' ...' if len(unexpected) > 5 else ''}")
    return (config, params, meta) if with_metadata else (config, params)
