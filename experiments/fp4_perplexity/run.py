"""Validation perplexity of a trained model in float32/bf16 vs weights quantized to each format.

    python experiments/fp4_perplexity/run.py [key=value ...]    e.g. model=runs/tiny-code/final num_windows=8

Weights-only variants quantize every Dense kernel but embed/lm_head (``quantize_params`` defaults)
and compute in float32; "_w4a4" variants also fake-quantize each Dense input to the weight's
format. Also reports the weight quantization error (pooled MSE/SQNR) of the same kernels.
Writes results.json and RESULTS.md into cfg.out_dir.
"""
import dataclasses
import datetime
import json
import os
import shlex
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config import get_config  # noqa: E402

from jaxserve.config import apply_overrides  # noqa: E402
from jaxserve.models.loading import resolve_model  # noqa: E402
from jaxserve.quant import MatmulSettings, kernel_plan, quantization_report, quantize_params  # noqa: E402
from jaxserve.quant.evaluate import perplexity, weight_error  # noqa: E402
from jaxserve.train.data import encode_split, windows  # noqa: E402
from pallas_kernels.fp4.quant_error import VARIANTS  # noqa: E402


def measure_variant(name, config, params, val, cfg):
    base, w4a4 = name.removesuffix("_w4a4"), name.endswith("_w4a4")
    fmt, opts = VARIANTS[base]
    qparams = quantize_params(params, fmt, **opts)
    report = quantization_report(params, qparams)
    plan = kernel_plan(params, fmt, **opts)
    row = perplexity(qparams, config, val, MatmulSettings(cfg.impl, w4a4=w4a4), cfg.batch_size)
    return {**row, "variant": name, "bytes": report.bytes_after, "bits_per_weight": report.bits_per_quantized_weight,
            "kernels": f"{report.num_quantized}/{len(plan)}",
            "weight_error": None if w4a4 else weight_error(params, base)}


def measure(cfg):
    config, params, tokenizer = resolve_model(cfg.model)
    if tokenizer is None:
        raise ValueError(f"{cfg.model} has no tokenizer.json: cannot build validation windows")
    val = windows(encode_split(tokenizer, None, "val"), cfg.seq_len)
    val = val[:cfg.num_windows] if cfg.num_windows else val
    rows = []
    for dtype in cfg.baselines:
        c = dataclasses.replace(config, dtype=dtype)
        p = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
        rows.append({**perplexity(p, c, val, None, cfg.batch_size), "variant": dtype,
                     "bytes": quantization_report(p, p).bytes_before, "bits_per_weight": 8 * jnp.dtype(dtype).itemsize,
                     "kernels": "0", "weight_error": None})
        print(rows[-1], flush=True)
    for name in cfg.variants:
        t = time.time()
        rows.append(measure_variant(name, config, params, val, cfg))
        print(f"{rows[-1]} ({time.time() - t:.0f} s)", flush=True)
    return config, rows, len(val)


def markdown(rows, meta):
    ref = rows[0]["val_ppl"]
    lines = [
        f"# Perplexity of {meta['model']} with quantized weights", "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; JAX {meta['jax_version']} ({meta['backend']}); quantized matmul impl "
        f"`{meta['impl']}`; {meta['val_tokens']} predicted tokens ({meta['num_windows']} validation windows of "
        f"{meta['seq_len'] + 1} tokens).", "",
        "Weights-only rows quantize every Dense kernel but embed/lm_head (\"kernels\": quantized/all) and "
        "compute in float32; `_w4a4` rows also fake-quantize each Dense input (NVFP4: one tensor scale per "
        "Dense call over the whole batch). bits/weight counts codes + block scales + tensor scale of the "
        "quantized kernels; MB is the whole params pytree. Weight SQNR is pooled over the quantized kernels "
        "(min over kernels in brackets).", "",
        f"| variant | kernels | bits/weight | MB | val loss | val ppl | ppl vs {rows[0]['variant']} | "
        "weight SQNR dB | weight MSE |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        we = r["weight_error"]
        err = (f"{we['sqnr_db']:.2f} ({we['min_sqnr_db']:.2f}) | {we['mse']:.3e}" if we and we["num_kernels"] else "| ")
        lines.append(f"| {r['variant']} | {r['kernels']} | {r['bits_per_weight']:.3f} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['val_loss']:.4f} | {r['val_ppl']:.3f} | {100 * (r['val_ppl'] / ref - 1):+.2f}% | {err} |")
    return "\n".join(lines) + "\n"


def main(argv):
    cfg = apply_overrides(get_config(), argv)
    config, rows, n = measure(cfg)
    meta = {"command": " ".join(["python", "experiments/fp4_perplexity/run.py"] + [shlex.quote(a) for a in argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "jax_version": jax.__version__, "backend": jax.default_backend(), "model": cfg.model, "impl": cfg.impl,
            "num_windows": n, "seq_len": cfg.seq_len, "val_tokens": rows[0]["val_tokens"],
            "model_config": dataclasses.asdict(config)}
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    text = markdown(rows, meta)
    with open(os.path.join(cfg.out_dir, "RESULTS.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
