"""Frozen configuration dataclasses and dotted command-line overrides.

``ModelConfig`` describes a decoder-only transformer (Llama / Qwen2 / Qwen3 family, optionally
MoE later); ``EngineConfig`` the serving engine. Overrides such as ``model.num_layers=4
engine.block_size=32`` are parsed and type-checked by OmegaConf against these dataclasses.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

ATTENTION_IMPLS = ("auto", "pallas", "reference")
DTYPES = ("float32", "bfloat16", "float16")


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str = "llama"  # llama | qwen2 | qwen3 (names follow HF's config.json)
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 704
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: True
    o_bias: bool = False  # Llama with attention_bias=True: True
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before RoPE
    dtype: str = "float32"  # activations and params
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            _require(getattr(self, name) > 0, f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"ModelConfig.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        _require(self.head_dim % 2 == 0, f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        _require(self.dtype in DTYPES, f"ModelConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        _require(self.rope_theta > 0, f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **kw: Any) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_bytes
    kv_cache_bytes: int = 256 * 2**20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    attention_impl: str = "auto"  # auto | pallas | reference
    seed: int = 0

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_bytes"):
            _require(getattr(self, name) > 0, f"EngineConfig.{name} must be > 0, got {getattr(self, name)}")
        _require(self.num_kv_blocks is None or self.num_kv_blocks > 0,
                 f"EngineConfig.num_kv_blocks must be > 0 or None, got {self.num_kv_blocks}")
        _require(self.max_model_len is None or self.max_model_len > 0,
                 f"EngineConfig.max_model_len must be > 0 or None, got {self.max_model_len}")
        _require(self.attention_impl in ATTENTION_IMPLS,
                 f"EngineConfig.attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")


def apply_overrides(config: Any, overrides: Sequence[str]) -> Any:
    """Returns a copy of the (nested, frozen) dataclass ``config`` with dotted overrides applied.

    ``overrides`` are ``key.sub=value`` strings; unknown keys and values of the wrong type raise
    ``ValueError`` naming the override. The dataclasses' own validation runs on the result.
    """
    for item in overrides:
        _require("=" in item, f"override {item!r} is not of the form key=value")
    base = OmegaConf.structured(config)
    OmegaConf.set_struct(base, True)
    for item in overrides:
        try:
            base = OmegaConf.merge(base, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as e:
            raise ValueError(f"bad override {item!r}: {str(e).splitlines()[0]}") from None
    return _to_dataclass(type(config), OmegaConf.to_container(base, resolve=True))


def _to_dataclass(cls, data: dict) -> Any:
    kwargs = {}
    for field in dataclasses.fields(cls):
        value = data[field.name]
        sub = _dataclass_type(cls, field)
        kwargs[field.name] = _to_dataclass(sub, value) if sub is not None and isinstance(value, dict) else value
    return cls(**kwargs)


def _dataclass_type(cls, field):
    import typing
    hint = typing.get_type_hints(cls).get(field.name)
    return hint if dataclasses.is_dataclass(hint) else None
