"""Loss-free balancing vs auxiliary loss vs nothing on a tiny byte-level MoE LM (Wang et al. 2024, small).

    python experiments/moe_balance/run.py [key=value ...]     e.g. steps=100 variants=[none]

Writes results.json and RESULTS.md into cfg.out_dir: MaxVio_batch over training, MaxVio_global and
perplexity on held-out windows, per variant.
"""
import datetime
import json
import os
import shlex
import sys
import time

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config import get_config  # noqa: E402

from jaxserve.config import ModelConfig, apply_overrides  # noqa: E402
from jaxserve.models.transformer import init_params  # noqa: E402
from jaxserve.moe import init_router_state  # noqa: E402
from jaxserve.moe.training import evaluate_balance, make_moe_train_step  # noqa: E402
from jaxserve.train.corpus import load_documents  # noqa: E402
from jaxserve.train.data import windows  # noqa: E402


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
    params = init_params(config, jax.random.key(cfg.seed))
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


def write(cfg, config, rows, command):
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    marks = [s for s in range(cfg.log_every, cfg.steps + 1, cfg.log_every * 4)]
    lines = ["# Loss-free balancing vs auxiliary loss (tiny byte-level MoE LM on pycode)", "",
             f"Command: `{command}`  ",
             f"Date: {datetime.date.today()}; JAX {jax.__version__} ({jax.default_backend()}); 2-core CPU shared "
             f"with other jobs. Model: {config.num_layers} MoE layers, hidden {config.hidden_size}, "
             f"{config.num_experts} experts top-{config.num_experts_per_tok} (width {config.moe_intermediate_size}), "
             f"sigmoid router, vocab 256 (bytes); {cfg.steps} AdamW steps (lr {cfg.lr}) of {cfg.batch_size}x"
             f"{cfg.seq_len} tokens ({cfg.steps * cfg.batch_size * cfg.seq_len / 1e6:.2f}M tokens); held-out: "
             f"{cfg.val_windows} windows of the val split. MaxVio = (max load - mean load) / mean load, "
             "averaged over layers.", "",
             "| variant | MaxVio_batch (last 20% of steps) | MaxVio_global (held-out) | val ppl | train loss | s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['max_vio_batch_last20pct']:.3f} | {r['max_vio_global']:.3f} | "
                     f"{r['val_ppl']:.3f} | {r['train_loss_last20pct']:.3f} | {r['seconds']:.0f} |")
    lines += ["", "MaxVio_batch during training (steps " + ", ".join(map(str, marks)) + "):", ""]
    for r in rows:
        lines.append(f"- {r['variant']}: " + ", ".join(f"{r['curve'][s - 1]['max_vio']:.2f}" for s in marks))
    with open(os.path.join(cfg.out_dir, "RESULTS.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    cfg = apply_overrides(get_config(), argv)
    config = model_config(cfg)
    train_w = byte_windows("train", cfg.seq_len)
    val_w = byte_windows("val", cfg.seq_len)[:cfg.val_windows]
    rows = []
    os.makedirs(cfg.out_dir, exist_ok=True)
    for variant in cfg.variants:  # results are rewritten after each variant: a cut-short run keeps its rows
        rows.append(run_variant(cfg, config, variant, train_w, val_w))
        print({k: v for k, v in rows[-1].items() if k != "curve"}, flush=True)
        write(cfg, config, rows, " ".join(["python", "experiments/moe_balance/run.py", *map(shlex.quote, argv)]))


if __name__ == "__main__":
    main(sys.argv[1:])
