"""Roofline model of LLM decode: hardware and model profiles -> step time, tokens/s, KV capacity.

Pure Python (no JAX), so it runs anywhere and is unit-testable in milliseconds. Quantities are in
bytes, FLOPs and seconds; "GB" and "TB/s" below are decimal (1e9, 1e12), as in NVIDIA's datasheets.

One decode step runs one token for each of ``batch`` sequences that already hold ``context``
tokens. Per GPU it must read the weights it touches (all of a dense model; for MoE, the experts
that some token in the batch routes to) and every sequence's KV cache, and do 2 FLOPs per active
weight per token plus the attention over the context. The roofline step time is
``max(bytes / bandwidth, flops / peak) + all-reduce time``: perfect overlap of memory and compute,
peak datasheet rates, no kernel-launch or scheduling overhead. It is an upper bound on throughput;
measured/predicted ratios say how far an implementation is from it.

Storage formats (bits per element, scales included): bf16 16, fp8 8, NVFP4 4 + 8/16 = 4.5 (an E4M3
scale per 16 elements; the per-tensor FP32 scale is negligible), MXFP4 4 + 8/32 = 4.25 (an E8M0
scale per 32). Quantized formats cover the linear layers of the transformer blocks; embeddings,
the LM head, norms and routers stay in BF16, as in NVIDIA ModelOpt's NVFP4 checkpoints and
DeepSeek-V3's FP8 release.
"""
from __future__ import annotations

import dataclasses
import math

FORMAT_BITS = {"fp32": 32.0, "bf16": 16.0, "fp8": 8.0, "nvfp4": 4.0 + 8 / 16, "mxfp4": 4.0 + 8 / 32}
# The tensor-core path each storage format's matmuls run on natively.
NATIVE_COMPUTE = {"fp32": "fp32", "bf16": "bf16", "fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}
_WIDER = ("fp4", "fp8", "bf16", "fp32")  # fallback order when the hardware lacks the native path


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def bytes_per_element(fmt: str) -> float:
    _check(fmt in FORMAT_BITS, f"unknown storage format {fmt!r}; known: {sorted(FORMAT_BITS)}")
    return FORMAT_BITS[fmt] / 8


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator. Peak FLOP/s are dense (no 2:4 sparsity); None = no tensor-core path."""
    name: str
    memory_bytes: float
    mem_bw: float  # bytes/s, device memory
    link_bw: float  # bytes/s per GPU, NVLink, both directions together (NVIDIA's quoted figure)
    fp32_flops: float | None = None
    bf16_flops: float | None = None
    fp8_flops: float | None = None
    fp4_flops: float | None = None
    gpus_per_node: int = 8
    scale_out_bw: float = 50e9  # bytes/s per GPU and direction between nodes (one 400 Gb/s NIC)
    source: str = ""

    def peak_flops(self, compute: str) -> float:
        value = getattr(self, f"{compute}_flops", None) if compute in _WIDER else None
        if value is None:
            raise ValueError(f"{self.name} has no {compute!r} compute path (known: {_WIDER})")
        return value

    def compute_for(self, fmt: str) -> str:
        """The compute path a format's matmuls use here: native, else the next wider one present
        (FP4 weights on Hopper, which has no FP4 tensor cores, run on its FP8 path)."""
        bytes_per_element(fmt)  # validates the name
        for c in _WIDER[_WIDER.index(NATIVE_COMPUTE[fmt]):]:
            if getattr(self, f"{c}_flops") is not None:
                return c
        raise ValueError(f"{self.name} has no compute path for format {fmt!r}")


# H100 SXM5: 80 GB HBM3, 3.35 TB/s; BF16 1,979 and FP8 3,958 TFLOP/s *with sparsity* -> 989.5 and
# 1,979 dense; NVLink 4 900 GB/s. https://www.nvidia.com/en-us/data-center/h100/ (datasheet table).
H100_SXM = Hardware("H100 SXM", memory_bytes=80e9, mem_bw=3.35e12, link_bw=900e9,
                    bf16_flops=989.5e12, fp8_flops=1979e12,
                    source="https://www.nvidia.com/en-us/data-center/h100/")
# H200 SXM: the H100's GH100 compute with 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s.
# https://www.nvidia.com/en-us/data-center/h200/
H200 = Hardware("H200 SXM", memory_bytes=141e9, mem_bw=4.8e12, link_bw=900e9,
                bf16_flops=989.5e12, fp8_flops=1979e12,
                source="https://www.nvidia.com/en-us/data-center/h200/")
# B200 (HGX/DGX B200, per GPU = 1/8 of the 8-GPU board): 1,440 GB -> 180 GB HBM3e (192 GB in the
# GTC 2024 announcement), 64 TB/s -> 8 TB/s; FP4 144 PF, FP8 72 PF, BF16 36 PF with sparsity ->
# 9, 4.5, 2.25 PF dense per GPU; NVLink 5 1.8 TB/s. https://www.nvidia.com/en-us/data-center/hgx/
# and the DGX B200 datasheet (https://www.nvidia.com/en-us/data-center/dgx-b200/).
B200 = Hardware("B200", memory_bytes=180e9, mem_bw=8e12, link_bw=1.8e12,
                bf16_flops=2.25e15, fp8_flops=4.5e15, fp4_flops=9e15,
                source="https://www.nvidia.com/en-us/data-center/hgx/")
HARDWARE = {"h100": H100_SXM, "h200": H200, "b200": B200}


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """A decoder-only transformer's shape, enough to count its weights, FLOPs and KV bytes.

    Attention is GQA (``num_kv_heads`` K/V heads of ``head_dim``) unless ``kv_lora_rank`` > 0: then
    it is DeepSeek's multi-head latent attention (MLA), which caches one ``kv_lora_rank`` latent
    plus one ``qk_rope_head_dim`` RoPE key per token and layer, shared by all heads; ``head_dim`` is
    then qk_nope_head_dim. MoE layers (all from ``first_k_dense`` on, when ``num_experts`` > 0)
    hold ``num_experts`` routed SwiGLU experts of ``expert_intermediate_size``, ``experts_per_tok``
    of them per token, plus ``num_shared_experts`` always-on ones of the same width.
    """
    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense SwiGLU width
    num_experts: int = 0
    experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_k_dense: int = 0
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: an RMSNorm weight of head_dim on q and on k
    qkv_bias: bool = False  # Qwen2
    q_lora_rank: int = 0  # MLA; 0 with MLA: a full-rank q projection
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    published_total_params: float | None = None
    published_active_params: float | None = None
    source: str = ""

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense if self.num_experts else 0

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    def attention_params(self) -> int:
        """Linear weights of one attention block (norm weights are in norm_params)."""
        h, n = self.hidden_size, self.num_heads
        if not self.is_mla:
            q_and_kv = (n + 2 * self.num_kv_heads) * self.head_dim
            return h * q_and_kv + n * self.head_dim * h + (q_and_kv if self.qkv_bias else 0)
        qk = self.head_dim + self.qk_rope_head_dim
        q = h * self.q_lora_rank + self.q_lora_rank * n * qk if self.q_lora_rank else h * n * qk
        kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)  # the cached latent and RoPE key
        kv_up = self.kv_lora_rank * n * (self.head_dim + self.v_head_dim)
        return q + kv_down + kv_up + n * self.v_head_dim * h

    def norm_params(self) -> int:
        per_layer = (2 * self.hidden_size + (self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0)
                     + (2 * self.head_dim if self.qk_norm else 0))
        return self.num_layers * per_layer + self.hidden_size

    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def router_params(self) -> int:
        return self.num_moe_layers * self.hidden_size * self.num_experts

    def block_linear_params(self, experts: float) -> float:
        """Quantizable weights: attention and MLP matrices, with ``experts`` routed experts (a mean,
        so possibly fractional) in each MoE layer besides the shared ones."""
        dense_mlp = (self.num_layers - self.num_moe_layers) * 3 * self.hidden_size * self.intermediate_size
        moe = self.num_moe_layers * (experts + self.num_shared_experts) * self.expert_params
        return self.num_layers * self.attention_params() + dense_mlp + moe

    def unquantized_params(self) -> int:
        """Weights kept in BF16 whatever the format: embeddings, LM head, norms, routers."""
        return self.embedding_params() + self.norm_params() + self.router_params()

    def total_params(self) -> int:
        return int(self.block_linear_params(self.num_experts)) + self.unquantized_params()

    def active_params(self) -> int:
        """Weights one token uses (the input embedding counted whole, as published counts do)."""
        return int(self.block_linear_params(self.experts_per_tok)) + self.unquantized_params()

    def kv_elements_per_token(self) -> int:
        """Cached numbers per token over all layers (MLA: the latent and the RoPE key)."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim

    def attention_flops_per_token(self, context: int) -> float:
        """Score and value FLOPs of one query token over ``context`` cached tokens, all layers.
        MLA runs absorbed (as DeepSeek serves it): scores over the 576-wide latent+rope, values over
        the 512-wide latent."""
        if self.is_mla:
            per_key = 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        else:
            per_key = 4 * self.num_heads * self.head_dim
        return self.num_layers * per_key * context

    @classmethod
    def from_config(cls, config, name: str = "") -> "ModelProfile":
        """From a ``jaxserve.config.ModelConfig`` (read by attribute, so no import): GQA, optionally MoE."""
        unmodelled = {"moe_layer_freq": (config.moe_layer_freq, 1), "o_bias": (config.o_bias, False),
                      "shared_expert_intermediate_size": (config.shared_expert_intermediate_size, 0),
                      "shared_expert_gate": (config.shared_expert_gate, False)}
        for key, (value, supported) in unmodelled.items():
            if config.num_experts or key == "o_bias":
                _check(value == supported, f"ModelProfile.from_config: {key}={value!r} is not modelled "
                                           f"(only {supported!r})")
        moe = config.num_experts > 0
        return cls(name=name or config.model_type, vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   num_layers=config.num_layers, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
                   head_dim=config.head_dim, intermediate_size=config.intermediate_size,
                   num_experts=config.num_experts, experts_per_tok=config.num_experts_per_tok if moe else 0,
                   expert_intermediate_size=config.expert_intermediate_size if moe else 0,
                   num_shared_experts=config.num_shared_experts if moe else 0,
                   first_k_dense=config.first_k_dense if moe else 0, tie_word_embeddings=config.tie_word_embeddings,
                   qk_norm=config.qk_norm, qkv_bias=config.qkv_bias)


# Published totals: Meta-Llama-3-70B's Hugging Face page lists 70.6B parameters.
LLAMA3_70B = ModelProfile(
    "Llama-3-70B", vocab_size=128256, hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
    intermediate_size=28672, published_total_params=70.6e9, published_active_params=70.6e9,
    source="https://huggingface.co/meta-llama/Meta-Llama-3-70B (config.json)")
# "46.7B total parameters but only uses 12.9B parameters per token": https://mistral.ai/news/mixtral-of-experts
MIXTRAL_8X7B = ModelProfile(
    "Mixtral-8x7B", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
    intermediate_size=14336, num_experts=8, experts_per_tok=2, expert_intermediate_size=14336,
    published_total_params=46.7e9, published_active_params=12.9e9,
    source="https://huggingface.co/mistralai/Mixtral-8x7B-v0.1 (config.json)")
# "671B total parameters with 37B activated for each token" (arXiv:2412.19437, abstract); the
# 14B multi-token-prediction module of the released 685B checkpoint is not part of the 671B.
DEEPSEEK_V3 = ModelProfile(
    "DeepSeek-V3", vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128,
    head_dim=128, intermediate_size=18432, num_experts=256, experts_per_tok=8, expert_intermediate_size=2048,
    num_shared_experts=1, first_k_dense=3, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
    v_head_dim=128, published_total_params=671e9, published_active_params=37e9,
    source="https://huggingface.co/deepseek-ai/DeepSeek-V3 (config.json)")
MODELS = {"llama3-70b": LLAMA3_70B, "mixtral-8x7b": MIXTRAL_8X7B, "deepseek-v3": DEEPSEEK_V3}


@dataclasses.dataclass(frozen=True)
class Precision:
    """Storage formats of the weights and the KV cache; TP all-reduces move ``activations``."""
    weights: str = "bf16"
    kv: str = "bf16"
    activations: str = "bf16"

    def __post_init__(self):
        for f in (self.weights, self.kv, self.activations):
            bytes_per_element(f)

    @property
    def unquantized(self) -> str:
        """Format of the weights that stay unquantized (embeddings, head, norms, routers)."""
        return "fp32" if self.weights == "fp32" else "bf16"


PRECISIONS = {f: Precision(f, f) for f in ("bf16", "fp8", "nvfp4", "mxfp4")}


def expected_experts_touched(num_experts: int, experts_per_tok: int, batch: float) -> float:
    """Mean number of distinct experts that ``batch`` tokens route to when each token picks
    ``experts_per_tok`` distinct experts uniformly at random: E (1 - (1 - k/E)^b). Skewed routing
    touches fewer, so this is the worst case for weight reads at a given batch."""
    if not 1 <= experts_per_tok <= num_experts:
        raise ValueError(f"experts_per_tok={experts_per_tok} must be in [1, num_experts={num_experts}]")
    if batch < 0:
        raise ValueError(f"batch must be >= 0, got {batch}")
    return num_experts * (1 - (1 - experts_per_tok / num_experts) ** batch)


def weight_memory(model: ModelProfile, prec: Precision) -> float:
    """Bytes of all the weights (every expert) in ``prec``."""
    return (model.block_linear_params(model.num_experts) * bytes_per_element(prec.weights)
            + model.unquantized_params() * bytes_per_element(prec.unquantized))


def kv_bytes_per_token(model: ModelProfile, prec: Precision) -> float:
    return model.kv_elements_per_token() * bytes_per_element(prec.kv)


def kv_shards(model: ModelProfile, tp: int) -> int:
    """Ways the KV cache splits over ``tp`` GPUs: by KV head, replicated beyond ``num_kv_heads``
    ranks; MLA's one latent per token is needed by every head, so each rank holds all of it."""
    return 1 if model.is_mla else min(tp, model.num_kv_heads)


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """One decode step on each of ``tp`` GPUs; bytes and FLOPs are per GPU."""
    batch: int
    context: int
    tp: int
    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    comm_s: float

    @property
    def step_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.comm_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.batch / self.step_s / self.tp

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def decode_step(model: ModelProfile, hw: Hardware, prec: Precision, batch: float, context: int,
                tp: int = 1) -> StepEstimate:
    """Roofline time of one decode step: ``batch`` sequences each attending to ``context`` tokens,
    the model split ``tp`` ways (Megatron tensor parallelism: two all-reduces per layer).

    Reads: the quantizable weights the batch touches, the LM head, norms and routers (the ``batch``
    input-embedding rows are left out: tiny), and every sequence's KV. FLOPs: 2 per touched
    weight per token plus attention, all at the weights' compute path (``Hardware.compute_for``).
    """
    if batch <= 0 or context < 0 or tp < 1:
        raise ValueError(f"need batch > 0, context >= 0, tp >= 1; got batch={batch}, context={context}, tp={tp}")
    routed = expected_experts_touched(model.num_experts, model.experts_per_tok, batch) if model.num_experts else 0
    head = model.vocab_size * model.hidden_size + model.norm_params() + model.router_params()
    weights = (model.block_linear_params(routed) * bytes_per_element(prec.weights)
               + head * bytes_per_element(prec.unquantized)) / tp
    kv = batch * context * kv_bytes_per_token(model, prec) / kv_shards(model, tp)
    matmul_weights = (model.block_linear_params(model.experts_per_tok) + model.router_params()
                      + model.vocab_size * model.hidden_size)
    flops = batch * (2 * matmul_weights + model.attention_flops_per_token(context)) / tp
    return StepEstimate(batch=batch, context=context, tp=tp, weight_bytes=weights, kv_bytes=kv, flops=flops,
                        memory_s=(weights + kv) / hw.mem_bw,
                        compute_s=flops / hw.peak_flops(hw.compute_for(prec.weights)),
                        comm_s=_allreduce_s(model, hw, prec, batch, tp))


def _allreduce_s(model: ModelProfile, hw: Hardware, prec: Precision, batch: float, tp: int) -> float:
    """Two ring all-reduces of the [batch, hidden] activations per layer, bandwidth term only (the
    per-collective latency of a few microseconds is left out, so this is optimistic at small batch)."""
    if tp == 1:
        return 0.0
    one_way = hw.link_bw / 2 if tp <= hw.gpus_per_node else hw.scale_out_bw
    message = batch * model.hidden_size * bytes_per_element(prec.activations)
    return 2 * model.num_layers * 2 * (tp - 1) / tp * message / one_way


def ridge_batch(model: ModelProfile, hw: Hardware, prec: Precision, context: int = 0, tp: int = 1,
                max_batch: float = 2.0 ** 24) -> float | None:
    """The batch at which a decode step turns compute-bound (compute time = memory time), or None
    when it stays memory-bound up to ``max_batch`` (per-token KV reads outpacing per-token FLOPs).
    Compute minus memory time is convex in batch and negative at 0, so it crosses zero once."""
    def compute_bound(b):
        e = decode_step(model, hw, prec, b, context, tp)
        return e.compute_s >= e.memory_s

    if not compute_bound(max_batch):
        return None
    lo, hi = 0.0, max_batch
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def kv_capacity(model: ModelProfile, hw: Hardware, prec: Precision, context: int, tp: int = 1,
                memory_fraction: float = 0.9) -> int:
    """Concurrent requests of ``context`` tokens whose KV fits beside the weights on ``tp`` GPUs,
    each using ``memory_fraction`` of its memory (vLLM's default gpu_memory_utilization, 0.9; the
    rest is left to activations and the runtime). 0 when the weights alone do not fit."""
    if context < 1 or not 0 < memory_fraction <= 1:
        raise ValueError(f"need context >= 1 and memory_fraction in (0, 1]; got {context}, {memory_fraction}")
    free = memory_fraction * hw.memory_bytes - weight_memory(model, prec) / tp
    per_request = context * kv_bytes_per_token(model, prec) / kv_shards(model, tp)
    return max(0, math.floor(free / per_request))


def min_tp(model: ModelProfile, hw: Hardware, prec: Precision, context: int, min_requests: int = 1,
           memory_fraction: float = 0.9, max_tp: int = 64) -> int:
    """The smallest power-of-two tensor-parallel degree that holds the weights and ``min_requests``
    requests of ``context`` tokens."""
    tp = 1
    while tp <= max_tp:
        if kv_capacity(model, hw, prec, context, tp, memory_fraction) >= min_requests:
            return tp
        tp *= 2
    raise ValueError(f"{model.name} in {prec} with {min_requests} x {context}-token requests does not fit "
                     f"on {max_tp} x {hw.name}")
