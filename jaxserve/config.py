"""Frozen configuration dataclasses and dotted command-line overrides.

``ModelConfig`` describes a decoder-only transformer (Llama / Qwen2 / Qwen3 family, and their
Mixture-of-Experts variants: Mixtral, Qwen3-MoE, DeepSeek-style routing); ``EngineConfig`` the serving engine. Overrides such as ``model.num_layers=4
engine.block_size=32`` are parsed and type-checked by OmegaConf against these dataclasses.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

ATTENTION_IMPLS = ("auto", "pallas", "mosaic", "xla", "reference")
QUANT_IMPLS = ("auto", "pallas", "mosaic", "reference")  # see jaxserve/quant/matmul.py kernel_for
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = (None, "nvfp4", "mxfp4", "fp8", "int4")
ACTIVATION_QUANTIZATIONS = (None, "int8")  # EngineConfig.activation_quantization
LM_HEAD_QUANTIZATIONS = (None, "int8")  # EngineConfig.lm_head_quantization
KV_ALLOCATIONS = ("paged", "orca_max", "orca_pow2", "orca_oracle")  # see jaxserve/cache/reservation.py
ROUTERS = ("mixtral", "qwen3_moe", "deepseek_v3")  # see jaxserve/moe/routers.py
MOE_DISPATCHES = ("auto", "all_to_all", "ragged")  # see jaxserve/parallel/layout.py resolve_moe_dispatch
WEIGHT_LAYOUTS = ("auto", "as_stored")
ROPE_TYPES = ("default", "linear", "llama3")  # see jaxserve/layers.py: rope_inv_freq
LAYER_TYPES = ("full_attention", "sliding_attention")
HIDDEN_ACTS = ("silu", "gelu_tanh")  # SwiGLU | GeGLU with tanh-approximated GELU (Gemma)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str = "llama"  # llama | qwen2 | qwen3 | mistral | gemma3_text | ... (names follow HF's config.json)
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
    # what Dense layers round their inputs and kernels to before the dot, summing in float32 (None: dtype);
    # their kernels are stored in it (MoE expert banks are not Dense layers: they compute in dtype).
    # "bfloat16" on a float32 model is TPU's default matmul precision, or torch.autocast(bfloat16) for
    # Linear layers: on the 2-core Zen 4 (AVX512-BF16) batch-1 decoding runs ~1.2x faster
    # (`git show f5419a8:benchmarks/RESULTS.md`, "bfloat16 matmuls")
    matmul_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Mixture-of-Experts (jaxserve/moe). num_experts=0: every layer is the dense SwiGLU MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 2  # top-k
    moe_intermediate_size: int = 0  # per-expert SwiGLU width; 0: intermediate_size
    num_shared_experts: int = 0  # always-on experts of moe_intermediate_size each (DeepSeek, Qwen-style)
    shared_expert_intermediate_size: int = 0  # their total width; 0: num_shared_experts * expert width
    shared_expert_gate: bool = False  # Qwen2-MoE: shared output times sigmoid(x @ w), w [hidden, 1]
    router: str = "mixtral"  # mixtral | qwen3_moe | deepseek_v3
    norm_topk_prob: bool = True  # renormalise the chosen gates to sum to 1 (qwen3_moe, deepseek_v3)
    routed_scaling_factor: float = 1.0  # deepseek_v3: gates times this
    n_group: int = 1  # deepseek_v3 group-limited routing: experts in n_group groups,
    topk_group: int = 1  # tokens choose among the topk_group best groups
    first_k_dense: int = 0  # layers [0, first_k_dense) stay dense
    moe_layer_freq: int = 1  # layer i >= first_k_dense is MoE when (i + 1) % moe_layer_freq == 0
    moe_capacity_factor: float = 0.0  # 0: dropless grouped matmul; > 0: Switch-style capacity, drops
    # RoPE scaling (HF's rope_type): default | linear (inverse frequencies / rope_factor) | llama3 (Llama 3.1:
    # wavelengths past original/low_freq_factor divided by rope_factor, below original/high_freq_factor kept,
    # smoothly interpolated between)
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    # Sliding-window attention (Mistral, Gemma 3): a token at position p sees the keys in (p - sliding_window, p]
    sliding_window: int | None = None
    # per layer, one of LAYER_TYPES; () with a sliding_window: every layer slides (Mistral)
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None  # sliding layers' own unscaled RoPE base (Gemma 3); None: as full layers
    query_pre_attn_scalar: float | None = None  # attention scale query_pre_attn_scalar ** -0.5; None: head_dim
    # Gemma-style blocks
    hidden_act: str = "silu"  # the MLP's gate activation, one of HIDDEN_ACTS
    norm_unit_offset: bool = False  # RMSNorm scales by (1 + weight), the product taken in float32
    sandwich_norms: bool = False  # RMSNorm on the attention and MLP outputs too (post_attention_norm,
    # pre_feedforward_norm, post_feedforward_norm; Gemma 2/3); without, post_attention_norm is the MLP's input norm
    scale_embeddings: bool = False  # embeddings times sqrt(hidden_size), rounded to dtype first
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)

    def __post_init__(self):
        if not isinstance(self.layer_types, tuple):  # from JSON or OmegaConf: keep the config hashable
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            _require(getattr(self, name) > 0, f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"ModelConfig.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        _require(self.head_dim % 2 == 0, f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        _require(self.dtype in DTYPES, f"ModelConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        _require(self.matmul_dtype is None or self.matmul_dtype in DTYPES,
                 f"ModelConfig.matmul_dtype must be None or one of {DTYPES}, got {self.matmul_dtype!r}")
        _require(self.rope_theta > 0, f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        self._validate_rope_and_window()
        _require(self.hidden_act in HIDDEN_ACTS,
                 f"ModelConfig.hidden_act must be one of {HIDDEN_ACTS}, got {self.hidden_act!r}")
        _require(self.final_logit_softcap is None or self.final_logit_softcap > 0,
                 f"ModelConfig.final_logit_softcap must be None or > 0, got {self.final_logit_softcap}")
        _require(self.query_pre_attn_scalar is None or self.query_pre_attn_scalar > 0,
                 f"ModelConfig.query_pre_attn_scalar must be None or > 0, got {self.query_pre_attn_scalar}")
        if self.num_experts:
            _require(self.hidden_act == "silu",
                     f"ModelConfig: MoE experts are SwiGLU, got hidden_act={self.hidden_act!r}")
            self._validate_moe()

    def _validate_rope_and_window(self):
        _require(self.rope_type in ROPE_TYPES,
                 f"ModelConfig.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        _require(self.rope_factor > 0, f"ModelConfig.rope_factor must be > 0, got {self.rope_factor}")
        if self.rope_type == "llama3":
            _require(0 < self.rope_low_freq_factor < self.rope_high_freq_factor,
                     f"ModelConfig: llama3 RoPE needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
                     f"{self.rope_low_freq_factor}, {self.rope_high_freq_factor}")
            _require(self.rope_original_max_position > 0,
                     f"ModelConfig.rope_original_max_position must be > 0, got {self.rope_original_max_position}")
        _require(self.rope_local_theta is None or self.rope_local_theta > 0,
                 f"ModelConfig.rope_local_theta must be None or > 0, got {self.rope_local_theta}")
        _require(self.sliding_window is None or self.sliding_window >= 1,
                 f"ModelConfig.sliding_window must be None or >= 1, got {self.sliding_window}")
        if self.layer_types:
            _require(len(self.layer_types) == self.num_layers,
                     f"ModelConfig.layer_types has {len(self.layer_types)} entries for num_layers={self.num_layers}")
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            _require(not bad, f"ModelConfig.layer_types entries must be in {LAYER_TYPES}, got {bad[:1]}")
            _require(self.sliding_window is not None or "sliding_attention" not in self.layer_types,
                     "ModelConfig.layer_types has sliding_attention layers but sliding_window is None")

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of decoder layer ``layer`` (0-based), None where it attends to everything."""
        if self.sliding_window is None or (self.layer_types and self.layer_types[layer] != "sliding_attention"):
            return None
        return self.sliding_window

    def _validate_moe(self):
        e, k = self.num_experts, self.num_experts_per_tok
        _require(e > 0, f"ModelConfig.num_experts must be >= 0, got {e}")
        _require(1 <= k <= e, f"ModelConfig.num_experts_per_tok={k} must be in [1, num_experts={e}]")
        _require(self.router in ROUTERS, f"ModelConfig.router must be one of {ROUTERS}, got {self.router!r}")
        for name in ("moe_intermediate_size", "num_shared_experts", "shared_expert_intermediate_size",
                     "first_k_dense", "moe_capacity_factor"):
            _require(getattr(self, name) >= 0, f"ModelConfig.{name} must be >= 0, got {getattr(self, name)}")
        _require(self.moe_layer_freq >= 1, f"ModelConfig.moe_layer_freq must be >= 1, got {self.moe_layer_freq}")
        _require(self.routed_scaling_factor > 0,
                 f"ModelConfig.routed_scaling_factor must be > 0, got {self.routed_scaling_factor}")
        g, tg = self.n_group, self.topk_group
        _require(g >= 1 and e % g == 0, f"ModelConfig.n_group={g} must be >= 1 and divide num_experts={e}")
        _require(1 <= tg <= g, f"ModelConfig.topk_group={tg} must be in [1, n_group={g}]")
        if g > 1:
            _require(self.router == "deepseek_v3", f"ModelConfig.n_group={g} needs router='deepseek_v3'")
            _require(e // g >= 2, f"ModelConfig: group-limited routing needs >= 2 experts per group, "
                                  f"got num_experts={e}, n_group={g}")
            _require(k <= tg * (e // g), f"ModelConfig.num_experts_per_tok={k} exceeds the experts in "
                                         f"topk_group={tg} groups of {e // g}")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) uses the MoE block instead of the dense MLP."""
        return (self.num_experts > 0 and layer >= self.first_k_dense
                and (layer + 1) % self.moe_layer_freq == 0)

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def shared_intermediate_size(self) -> int:
        """Width of the one SwiGLU holding all shared experts (0: none)."""
        if not self.num_shared_experts:
            return 0
        return self.shared_expert_intermediate_size or self.num_shared_experts * self.expert_intermediate_size

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
    # sequences running more than one token in a step (prefill chunks); bounds a mixed step's attention work
    max_num_partial_prefills: int = 8
    # decode steps one device program runs when every running sequence decodes (vLLM's num_scheduler_steps): the
    # dispatch and host work of a step are paid once per K tokens (the same tokens; warm-up compiles each decode
    # bucket's program K steps unrolled, ~K times longer); 1: one step a program. Not with speculative decoding (a
    # round already emits several tokens a program)
    num_scheduler_steps: int = 1
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    # auto (pallas on GPU, xla elsewhere) | pallas | mosaic (Hopper decode kernel, GPU only) | xla | reference
    attention_impl: str = "auto"
    quantization: str | None = None  # None | nvfp4 | mxfp4 | fp8 | int4: weight-only, post-training
    # (of the target: with speculative decoding the draft model or Medusa heads keep their own weights)
    # the quantized matmul: auto (Pallas FP4 kernel on GPU, dequantize-then-dot on CPU) | pallas
    # (the kernel; interpret mode on CPU) | mosaic (the Mosaic GPU kernel only; its CPU interpreter off a
    # GPU) | reference (dequantize-then-dot); fp8/int4 always dequantize. On a Hopper GPU auto/pallas
    # run the Mosaic GPU kernel where it applies (bf16 products), the Triton one elsewhere.
    quant_impl: str = "auto"
    # with a quantization (nvfp4/mxfp4: the CPU kernel reads it): also the LM head; a tied head quantizes the
    # embedding table along the hidden axis, its lookup dequantizing the looked-up rows (one device only)
    quantize_lm_head: bool = False
    # with nvfp4/mxfp4: None (weight-only) | int8: activations quantized to int8 on the weights' blocks for the Dense
    # matmuls (W4A8, llama.cpp's Q8 activations; jaxserve.quant.w4a8): the AVX-512 VNNI kernel on CPU, fewer
    # operations a weight than decoding FP4 to bf16; costs accuracy (experiments/fp4_perplexity)
    activation_quantization: str | None = None
    # the LM head: None (as the model's dtype, or with quantize_lm_head) | int8: int8 weights, one scale a vocabulary
    # row, times int8 activations in blocks of 32 (jaxserve.kernels.cpu.int8_head: the AVX-512 VNNI kernel for decode
    # rows on CPU); a tied embedding stays as it is for the lookup (one device only)
    lm_head_quantization: str | None = None
    seed: int = 0
    # paged: blocks on demand (vLLM). orca_*: the vLLM paper's baselines, a contiguous reservation per
    # request of max_model_len / the next power of two of its length / its exact length (experiments).
    kv_allocation: str = "paged"
    # the device mesh (vLLM's names; jaxserve/parallel/layout.py): Megatron tensor parallelism over T devices
    # (heads, KV heads and MLP columns split, the KV pool sharded by KV head); enable_expert_parallel splits
    # every MoE layer's experts over all D x T devices (all_to_all dispatch); data_parallel_size D (only with
    # expert parallelism) adds data-parallel attention replicas beside the expert-parallel MoE
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    # how expert parallelism moves tokens to their experts and back: auto (ragged on GPU/TPU, all_to_all on
    # CPU) | all_to_all (padded to the worst case, works everywhere) | ragged (lax.ragged_all_to_all: only the
    # live rows; XLA:CPU has none, so an error there)
    moe_dispatch: str = "auto"
    # how the runner holds bf16 and float32 Dense kernels: auto (on one CPU device with the kernels built, packed
    # once, every row count on one packed GEMM: bf16 in AMX tiles' layout, on the tiles or on float32 FMAs without
    # them, jaxserve.kernels.cpu.packed; float32 in 32-column groups, jaxserve.kernels.cpu.packed_f32; else as
    # stored) | as_stored ([K, N])
    weight_layout: str = "auto"

    def __post_init__(self):
        _check_engine_types(self)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_num_partial_prefills",
                     "kv_cache_bytes", "tensor_parallel_size", "data_parallel_size", "num_scheduler_steps"):
            _require(getattr(self, name) > 0, f"EngineConfig.{name} must be > 0, got {getattr(self, name)}")
        _require(self.num_kv_blocks is None or self.num_kv_blocks > 0,
                 f"EngineConfig.num_kv_blocks must be > 0 or None, got {self.num_kv_blocks}")
        _require(self.max_model_len is None or self.max_model_len > 0,
                 f"EngineConfig.max_model_len must be > 0 or None, got {self.max_model_len}")
        _require(self.attention_impl in ATTENTION_IMPLS,
                 f"EngineConfig.attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
        _require(self.quantization in QUANTIZATIONS,
                 f"EngineConfig.quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        _require(self.quant_impl in QUANT_IMPLS,
                 f"EngineConfig.quant_impl must be one of {QUANT_IMPLS}, got {self.quant_impl!r}")
        _require(not self.quantize_lm_head or self.quantization is not None,
                 f"EngineConfig.quantize_lm_head=True needs a quantization, got quantization={self.quantization!r}")
        _require(self.activation_quantization in ACTIVATION_QUANTIZATIONS,
                 f"EngineConfig.activation_quantization must be one of {ACTIVATION_QUANTIZATIONS}, got "
                 f"{self.activation_quantization!r}")
        _require(self.activation_quantization is None or self.quantization in ("nvfp4", "mxfp4"),
                 f"EngineConfig.activation_quantization={self.activation_quantization!r} needs quantization nvfp4 or "
                 f"mxfp4, got {self.quantization!r}")
        _require(self.activation_quantization is None or self.quant_impl in ("auto", "reference"),
                 f"EngineConfig.activation_quantization={self.activation_quantization!r} runs with quant_impl auto "
                 f"or reference, got {self.quant_impl!r}")
        _require(self.lm_head_quantization in LM_HEAD_QUANTIZATIONS,
                 f"EngineConfig.lm_head_quantization must be one of {LM_HEAD_QUANTIZATIONS}, got "
                 f"{self.lm_head_quantization!r}")
        _require(self.lm_head_quantization is None or not self.quantize_lm_head,
                 f"EngineConfig.lm_head_quantization={self.lm_head_quantization!r} and quantize_lm_head=True both "
                 f"quantize the head: pick one")
        _require(self.lm_head_quantization is None or (self.tensor_parallel_size == 1 and self.data_parallel_size == 1
                                                       and not self.enable_expert_parallel),
                 f"EngineConfig.lm_head_quantization={self.lm_head_quantization!r} runs on one device, got "
                 f"tensor_parallel_size={self.tensor_parallel_size}, data_parallel_size={self.data_parallel_size}, "
                 f"enable_expert_parallel={self.enable_expert_parallel}")
        _require(not self.quantize_lm_head or self.tensor_parallel_size == 1,
                 f"EngineConfig.quantize_lm_head=True runs on one device, got tensor_parallel_size="
                 f"{self.tensor_parallel_size}")
        _require(self.kv_allocation in KV_ALLOCATIONS,
                 f"EngineConfig.kv_allocation must be one of {KV_ALLOCATIONS}, got {self.kv_allocation!r}")
        _require(self.moe_dispatch in MOE_DISPATCHES,
                 f"EngineConfig.moe_dispatch must be one of {MOE_DISPATCHES}, got {self.moe_dispatch!r}")
        _require(self.weight_layout in WEIGHT_LAYOUTS,
                 f"EngineConfig.weight_layout must be one of {WEIGHT_LAYOUTS}, got {self.weight_layout!r}")


def _check_engine_types(ec: EngineConfig) -> None:
    """Integers are ints and flags bools (TypeError naming the field); ranges are checked after."""
    from jaxserve.validation import check_bool, check_int
    for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_num_partial_prefills",
                 "kv_cache_bytes", "seed", "tensor_parallel_size", "data_parallel_size", "num_scheduler_steps"):
        check_int(f"EngineConfig.{name}", getattr(ec, name))
    for name in ("num_kv_blocks", "max_model_len"):
        check_int(f"EngineConfig.{name}", getattr(ec, name), optional=True)
    check_bool("EngineConfig.enable_prefix_caching", ec.enable_prefix_caching)
    check_bool("EngineConfig.enable_expert_parallel", ec.enable_expert_parallel)
    check_bool("EngineConfig.quantize_lm_head", ec.quantize_lm_head)
    _require(ec.seed >= 0, f"EngineConfig.seed must be >= 0, got {ec.seed}")
    for name in ("attention_impl", "kv_allocation", "moe_dispatch", "weight_layout"):
        if not isinstance(getattr(ec, name), str):
            raise TypeError(f"EngineConfig.{name} must be a str, got {getattr(ec, name)!r}")


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


@dataclasses.dataclass(frozen=True)
class EngineOverrides:
    """The ``engine.*`` namespace of command-line overrides (``engine.block_size=32``)."""
    engine: EngineConfig = EngineConfig()


def engine_kwargs(overrides: Sequence[str]) -> dict[str, Any]:
    """``LLM`` keyword arguments (every ``EngineConfig`` field) from dotted ``engine.*`` overrides."""
    engine = apply_overrides(EngineOverrides(), overrides).engine
    return {f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)}


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
