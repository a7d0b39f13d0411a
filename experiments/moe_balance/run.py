"""Loss-free balancing vs auxiliary loss vs nothing on a tiny byte-level MoE LM (Wang et al. 2024, small).

    python -m experiments.moe_balance [key=value ...]     e.g. steps=100 variants=[none]

MaxVio_batch over training, MaxVio_global and perplexity on held-out windows, per variant.
"""
import time

import jax
import numpy as np
import optax

from jaxserve.config import ModelConfig
from jaxserve.models.transformer import init_params
from jaxserve.moe import init_router_state
from jaxserve.train.moe import evaluate_balance, make_moe_train_step
from jaxserve.train.corpus import load_documents
from jaxserve.train.data import windows


def byte_windows(split, seq_len):
    """The split's documents as UTF-8 bytes, NUL-separated, cut into windows i32[W, seq_len + 1]."""
    stream = np.frombuffer(b"\0".join(d.encode() for d in load_documents(None, split)), np.uint8)
    return windows(stream.astype(np.int32), seq_len)


def model_config(cfg):
    return ModelConfig(vocab_size=256, hidden_size=cfg.hidden_size, intermediate_size=cfg.moe_intermediate_size,
                       num_layers=cfg.num_layers, num_heads=4, num_kv_heads=4, head_dim=cfg.hidden_size // 4,
                       max_position_embeddings=cfg.seq_len, num_experts=cfg.num_experts,
                       num_experts_per_tok=cfg.num_experts_per_tok, moe_intermediate_size=cfg.moe_intermediate_size,
                       router="deepseek_v3")


def run_variant(cfg, config, variant, train_w, val_w):
    mode, _, value = variant.partition(":")
    step = make_moe_train_step(config, optax.adamw(cfg.lr), mode, alpha=float(value or 0), rate=float(value or 0))
    # jitted: one program, where op-by-op initialisation compiled ~100 small ones (~5 s of a smoke run); the weights
    # differ from op-by-op ones by at most an ulp (fused random-normal arithmetic)
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(cfg.seed))
    state, opt_state = init_router_state(config), optax.adamw(cfg.lr).init(params)
    order = np.random.default_rng(cfg.seed).integers(0, len(train_w), (cfg.steps, cfg.batch_size))
    curve, t0 = [], time.perf_counter()
    for s in range(cfg.steps):
        params, state, opt_state, m = step(params, state, opt_state, train_w[order[s]])
        curve.append({"step": s + 1, "loss": float(m["loss"]), "max_vio": float(m["max_vio"])})
    seconds = time.perf_counter() - t0
    ev = evaluate_balance(params, state, config, val_w)
    tail = curve[-max(1, cfg.steps // 5):]
    return {"variant": variant, "seconds": seconds, **ev, "curve": curve,
            "max_vio_batch_last20pct": float(np.mean([c["max_vio"] for c in tail])),
            "train_loss_last20pct": float(np.mean([c["loss"] for c in tail]))}


def describe(cfg, config):
    return (f"Model: {config.num_layers} MoE layers, hidden {config.hidden_size}, {config.num_experts} experts "
            f"top-{config.num_experts_per_tok} (width {config.moe_intermediate_size}), sigmoid router, vocab 256 "
            f"(bytes); {cfg.steps} AdamW steps (lr {cfg.lr}) of {cfg.batch_size}x{cfg.seq_len} tokens "
            f"({cfg.steps * cfg.batch_size * cfg.seq_len / 1e6:.2f}M tokens); held-out: {cfg.val_windows} windows "
            "of the val split. MaxVio = (max load - mean load) / mean load, averaged over layers. "
            "Seconds are wall time on the machine above (shared: not comparable between variants).")


def plot(ax, rows):
    for r in rows:
        ax.plot([c["step"] for c in r["curve"]], [c["max_vio"] for c in r["curve"]], label=r["variant"], lw=1)
    ax.set(xlabel="training step", ylabel="MaxVio_batch", yscale="log")
    ax.legend(fontsize="small")


def run(cfg, out):
    config = model_config(cfg)
    train_w = byte_windows("train", cfg.seq_len)
    val_w = byte_windows("val", cfg.seq_len)[:cfg.val_windows]
    rows = []
    for variant in out.progress(cfg.variants, desc="variants"):
        rows.append(run_variant(cfg, config, variant, train_w, val_w))
        out.json("runs", rows)  # rewritten after each variant: a cut-short run keeps its rows
    out.text(describe(cfg, config))
    out.table("variants", rows, {"variant": "variant", "max_vio_batch_last20pct": "MaxVio_batch (last 20% of steps)",
                                 "max_vio_global": "MaxVio_global (held-out)", "val_ppl": "val ppl",
                                 "train_loss_last20pct": "train loss", "seconds": "s"},
              fmt={"max_vio_batch_last20pct": ".3f", "max_vio_global": ".3f", "val_ppl": ".3f",
                   "train_loss_last20pct": ".3f", "seconds": ".0f"})
    marks = list(range(cfg.log_every, cfg.steps + 1, cfg.log_every * 4))
    out.text(f"MaxVio_batch during training (steps {', '.join(map(str, marks))}):\n\n" + "\n".join(
        f"- {r['variant']}: " + ", ".join(f"{r['curve'][s - 1]['max_vio']:.2f}" for s in marks) for r in rows))
    with out.figure("max_vio_batch", "MaxVio_batch over training, per balancing variant") as ax:
        plot(ax, rows)


if __name__ == "__main__":  # an alias of python -m experiments.moe_balance
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from experiments.harness import main
    main("moe_balance")
