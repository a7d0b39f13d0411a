"""Roofline model of LLM decode on H100, H200 and B200 at BF16, FP8 and NVFP4 (perfmodel.py).

Predicts decode tokens/s per GPU against batch size, the batch at which decode turns
compute-bound, KV capacity in concurrent requests and the tensor-parallel degree needed to fit,
for Llama-3-70B, Mixtral 8x7B and DeepSeek-V3; states the seed's hardware claims as numbers; and
checks the model against jaxserve's own measured decode step on this machine (validate.py).
"""
from __future__ import annotations

from experiments.blackwell_roofline.validate import check_device, validate
from experiments.blackwell_roofline import perfmodel as pm

_STYLE = {"bf16": "-", "fp8": "--", "nvfp4": ":", "mxfp4": "-."}


def run(cfg, out) -> None:
    check_device(cfg)
    out.text(f"Roofline: step time = max(bytes / bandwidth, FLOPs / peak) + TP all-reduce time, with datasheet "
             f"peaks (dense, no sparsity) and no launch or scheduling overhead, so an upper bound on throughput. "
             f"Each sequence attends to {cfg.context} tokens; weights and KV cache in the named format "
             f"(NVFP4 = 4.5 bits/element with its E4M3 per-16 scales; embeddings, LM head, norms and "
             f"routers stay BF16). FP4 on Hopper runs on the FP8 tensor cores. See perfmodel.py beside this script.")
    seed_claims(cfg, out)
    model_table(out)
    predictions(cfg, out)
    moe_table(out)
    if cfg.device != "none":
        validate(cfg, out)


def seed_claims(cfg, out) -> None:
    llama, ds = pm.LLAMA3_70B, pm.DEEPSEEK_V3

    def weights_ratio(model, fmt):
        return pm.weight_memory(model, pm.PRECISIONS[fmt]) / pm.weight_memory(model, pm.PRECISIONS["fp8"])

    def rate(hw, fmt):
        prec = pm.PRECISIONS[fmt]
        tp = pm.min_tp(llama, hw, prec, cfg.context, 64, cfg.memory_fraction)
        return pm.decode_step(llama, hw, prec, 64, cfg.context, tp).tokens_per_s_per_gpu

    rows = [
        {"claim": "B200 memory bandwidth / H100 SXM's (> 2x)", "value": pm.B200.mem_bw / pm.H100_SXM.mem_bw},
        {"claim": "B200 memory bandwidth / H200's", "value": pm.B200.mem_bw / pm.H200.mem_bw},
        {"claim": "NVLink 5 / NVLink 4 per-GPU bandwidth (1.8 TB/s vs 900 GB/s)",
         "value": pm.B200.link_bw / pm.H100_SXM.link_bw},
        {"claim": "NVFP4 / FP8 bytes of a quantized matrix (4.5 / 8 bits)", "value": 4.5 / 8},
        {"claim": "MXFP4 / FP8 bytes of a quantized matrix (4.25 / 8 bits)", "value": 4.25 / 8},
        {"claim": "NVFP4 / FP8 weight memory, Llama-3-70B (BF16 embeddings kept)",
         "value": weights_ratio(llama, "nvfp4")},
        {"claim": "NVFP4 / FP8 weight memory, DeepSeek-V3", "value": weights_ratio(ds, "nvfp4")},
        {"claim": f"Llama-3-70B decode tokens/s per GPU at batch 64, B200 NVFP4 / H100 FP8 (ctx {cfg.context})",
         "value": rate(pm.B200, "nvfp4") / rate(pm.H100_SXM, "fp8")},
        {"claim": "same, B200 FP8 / H100 FP8 (the bandwidth alone)",
         "value": rate(pm.B200, "fp8") / rate(pm.H100_SXM, "fp8")},
    ]
    out.table("seed_claims", rows, {"claim": "claim", "value": "ratio"}, title="The seed's claims as numbers",
              fmt={"value": ".3f"})


def model_table(out) -> None:
    rows = []
    for m in pm.MODELS.values():
        rows.append({"model": m.name, "total_params": m.total_params(), "published_total": m.published_total_params,
                     "active_params": m.active_params(), "published_active": m.published_active_params,
                     **{f"kv_bytes_per_token_{f}": pm.kv_bytes_per_token(m, pm.PRECISIONS[f])
                        for f in ("bf16", "fp8", "nvfp4")},
                     **{f"weights_gb_{f}": pm.weight_memory(m, pm.PRECISIONS[f]) / 1e9
                        for f in ("bf16", "fp8", "nvfp4")}})
    billions = {k: (lambda r, k=k: f"{r[k] / 1e9:.2f}B") for k in
                ("total_params", "published_total", "active_params", "published_active")}
    out.table("models", rows, {"model": "model", "total_params": "params (ours)", "published_total": "published",
                               "active_params": "active (ours)", "published_active": "published active",
                               "kv_bytes_per_token_bf16": "KV B/token bf16", "kv_bytes_per_token_nvfp4":
                               "KV B/token nvfp4", "weights_gb_bf16": "weights GB bf16",
                               "weights_gb_fp8": "GB fp8", "weights_gb_nvfp4": "GB nvfp4"},
              title="Models: parameters derived from the architecture vs published; KV bytes per token (all layers)",
              fmt={**billions, "kv_bytes_per_token_bf16": ".0f", "kv_bytes_per_token_nvfp4": ".0f",
                   "weights_gb_bf16": ".1f", "weights_gb_fp8": ".1f", "weights_gb_nvfp4": ".1f"})


def predictions(cfg, out) -> None:
    sweep, summary = [], []
    for hw_key in cfg.hardware:
        hw = pm.HARDWARE[hw_key]
        for model_key in cfg.models:
            model = pm.MODELS[model_key]
            for fmt in cfg.formats:
                prec = pm.PRECISIONS[fmt]
                tp = pm.min_tp(model, hw, prec, cfg.context, cfg.min_requests, cfg.memory_fraction)
                capacity = pm.kv_capacity(model, hw, prec, cfg.context, tp, cfg.memory_fraction)
                key = {"gpu": hw.name, "model": model.name, "format": fmt, "tp": tp}
                for b in cfg.batches:
                    e = pm.decode_step(model, hw, prec, b, cfg.context, tp)
                    sweep.append({**key, "batch": b, "fits": b <= capacity, "step_ms": e.step_s * 1e3,
                                  "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu, "bound": e.bound,
                                  "comm_ms": e.comm_s * 1e3})
                full = pm.decode_step(model, hw, prec, capacity, cfg.context, tp)  # every KV slot in use
                summary.append({**key, "weights_gb_per_gpu": pm.weight_memory(model, prec) / tp / 1e9,
                                "capacity": capacity, "ridge_ctx0": pm.ridge_batch(model, hw, prec, 0, tp),
                                "ridge_ctx": pm.ridge_batch(model, hw, prec, cfg.context, tp),
                                "tok_s_b1": sweep[-len(cfg.batches)]["tokens_per_s_per_gpu"],
                                "tok_s_full": full.tokens_per_s_per_gpu, "bound_full": full.bound})
    out.json("sweep", sweep)
    ridge = {k: (lambda r, k=k: "never" if r[k] is None else f"{r[k]:.0f}") for k in ("ridge_ctx0", "ridge_ctx")}
    out.table("summary", summary,
              {"gpu": "GPU", "model": "model", "format": "format", "tp": "TP", "weights_gb_per_gpu": "weights GB/GPU",
               "capacity": f"KV capacity (requests of {cfg.context} tok)", "ridge_ctx0": "ridge batch (ctx 0)",
               "ridge_ctx": f"ridge batch (ctx {cfg.context})", "tok_s_b1": "tok/s/GPU at b=1",
               "tok_s_full": "tok/s/GPU, KV full", "bound_full": "bound, KV full"},
              title=f"Decode per GPU (TP: smallest power of two holding the weights and {cfg.min_requests} "
                    f"requests of {cfg.context} tokens; capacity per TP group at memory fraction "
                    f"{cfg.memory_fraction}; ridge: the batch where the step turns compute-bound)",
              fmt={**ridge, "weights_gb_per_gpu": ".1f", "tok_s_b1": ".0f", "tok_s_full": ".0f"})
    _plot(cfg, out, sweep)


def _plot(cfg, out, sweep) -> None:
    colors = {name: f"C{i}" for i, name in enumerate(pm.HARDWARE[k].name for k in cfg.hardware)}
    with out.figure("decode_tokens_per_gpu", f"Predicted decode tokens/s per GPU vs batch (context {cfg.context}); "
                    "line style: format, colour: GPU; lines end where the KV cache is full.",
                    ncols=len(cfg.models), figsize=(5 * len(cfg.models), 4.2), squeeze=False) as axes:
        for ax, model_key in zip(axes[0], cfg.models):
            name = pm.MODELS[model_key].name
            for (gpu, fmt), rows in _groups(sweep, name).items():
                rows = [r for r in rows if r["fits"]]
                if rows:
                    ax.plot([r["batch"] for r in rows], [r["tokens_per_s_per_gpu"] for r in rows], _STYLE[fmt],
                            color=colors[gpu], marker=".", label=f"{gpu} {fmt} (TP{rows[0]['tp']})")
            ax.set(xscale="log", yscale="log", xlabel="batch (sequences)", ylabel="tokens/s per GPU", title=name)
            ax.legend(fontsize=6)


def _groups(sweep, model_name) -> dict:
    groups = {}
    for r in sweep:
        if r["model"] == model_name:
            groups.setdefault((r["gpu"], r["format"]), []).append(r)
    return groups


def moe_table(out) -> None:
    rows = []
    for m in (pm.MIXTRAL_8X7B, pm.DEEPSEEK_V3):
        for b in (1, 4, 16, 64, 256, 1024):
            touched = pm.expected_experts_touched(m.num_experts, m.experts_per_tok, b)
            step = pm.decode_step(m, pm.B200, pm.PRECISIONS["fp8"], b, 0, tp=1)
            rows.append({"model": m.name, "batch": b, "experts_touched": touched,
                         "share_of_experts": touched / m.num_experts,
                         "weight_gb_read": step.weight_bytes / 1e9,
                         "weight_bytes_per_token_gb": step.weight_bytes / b / 1e9})
    columns = {"model": "model", "batch": "batch", "experts_touched": "experts touched",
               "share_of_experts": "share of routed experts", "weight_gb_read": "weight GB read per step (FP8)",
               "weight_bytes_per_token_gb": "GB per token"}
    out.table("moe_expert_reads", rows, columns, title="MoE: expected distinct experts per layer a batch routes to "
              "(uniform routing: E(1 - (1 - k/E)^b)) and the FP8 weight bytes one decode step reads",
              fmt={"experts_touched": ".1f", "share_of_experts": ".2f", "weight_gb_read": ".1f",
                   "weight_bytes_per_token_gb": ".3f"})

