"""Validation perplexity of a trained model in float32/bf16 vs weights quantized to each format.

    python experiments/fp4_perplexity/run.py [key=value ...]    e.g. model=jaxserve/tiny-code-draft num_windows=8

Weights-only variants quantize every Dense kernel but embed/lm_head (``quantize_params`` defaults)
and compute in float32; "_w4a4" variants also fake-quantize each Dense input to the weight's
format. Also reports the quantization error (pooled MSE/SQNR) of the same kernels' weights and of
their inputs (activations of the first batch of validation windows, float32 model).
Writes results_<model>.json into cfg.out_dir, then RESULTS.md with one section per results_*.json there.
"""
import dataclasses
import datetime
import glob
import json
import os
import re
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config import get_config  # noqa: E402

from jaxserve.config import apply_overrides  # noqa: E402
from jaxserve.models.loading import resolve_model  # noqa: E402
from jaxserve.quant import (MatmulSettings, kernel_plan, quantization_report, quantize_params,  # noqa: E402
                            weight_bytes)
from jaxserve.quant.evaluate import activation_error, dense_inputs, perplexity, weight_error  # noqa: E402
from jaxserve.train.data import encode_split, windows  # noqa: E402
from pallas_kernels.fp4.quant_error import VARIANTS  # noqa: E402


def measure_variant(name, config, params, val, cfg):
    base, w4a4 = name.removesuffix("_w4a4"), name.endswith("_w4a4")
    fmt, opts = VARIANTS[base]
    qparams = quantize_params(params, fmt, **opts)
    report = quantization_report(params, qparams)
    plan = kernel_plan(params, fmt, **opts)
    row = perplexity(qparams, config, val, MatmulSettings(cfg.impl, w4a4=w4a4), cfg.batch_size)
    bits = report.bits_per_quantized_weight if report.num_quantized else float("nan")
    return {**row, "variant": name, "bytes": report.bytes_after, "bits_per_weight": bits,
            "kernels": f"{report.num_quantized}/{len(plan)}"}


def measure_errors(config, params, val, cfg):
    """Weight and activation quantization error of each base format of cfg.variants."""
    inputs = dense_inputs(params, config, val[:cfg.batch_size, :-1])
    names = dict.fromkeys(v.removesuffix("_w4a4") for v in cfg.variants)
    return [{"variant": v, "weights": weight_error(params, v), "activations": activation_error(inputs, v)}
            for v in names]


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
                     "bytes": weight_bytes(p), "bits_per_weight": 8 * jnp.dtype(dtype).itemsize,
                     "kernels": "none"})
        print({k: v for k, v in rows[-1].items() if k != "window_loss"}, flush=True)
    for name in cfg.variants:
        t = time.time()
        rows.append(measure_variant(name, config, params, val, cfg))
        print({k: v for k, v in rows[-1].items() if k != "window_loss"}, f"({time.time() - t:.0f} s)", flush=True)
    return config, rows, measure_errors(config, params, val, cfg), len(val)


NOTES = "## Notes"


def _describe(c):
    return (f"{c['model_type']}, hidden {c['hidden_size']}, {c['num_layers']} layers, MLP {c['intermediate_size']}, "
            f"vocab {c['vocab_size']}, {'tied' if c['tie_word_embeddings'] else 'untied'} embeddings")


def _fmt(x, spec):
    return "n/a" if x != x else format(x, spec)  # NaN: the format selects nothing here


def markdown(rows, errors, meta):
    ref = rows[0]["val_ppl"]
    lines = [
        f"## {meta['model']} (impl {meta['impl']})", "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; JAX {meta['jax_version']} ({meta['backend']}); quantized matmul impl "
        f"`{meta['impl']}`; {meta['val_tokens']} predicted tokens ({meta['num_windows']} validation windows of "
        f"{meta['seq_len'] + 1} tokens). Model: {_describe(meta['model_config'])}; float32 params {rows[0]['bytes'] / 1e6:.2f} MB.",
        "",
        "Weights-only rows quantize every Dense kernel but embed/lm_head (\"kernels\": quantized/all) and "
        "compute in float32; `_w4a4` rows also fake-quantize each Dense input (NVFP4: one tensor scale per "
        "Dense call over the whole batch). bits/weight counts codes + block scales + tensor scale of the "
        "quantized kernels; MB is the whole params pytree.", "",
        f"Δ loss is paired against {rows[0]['variant']} on the same windows: mean ± 2 standard errors of the "
        "per-window difference.", "",
        f"| variant | kernels | bits/weight | MB | val loss | Δ loss | val ppl | ppl vs {rows[0]['variant']} |",
        "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = np.asarray(r["window_loss"]) - np.asarray(rows[0]["window_loss"])
        se = d.std(ddof=1) / np.sqrt(d.size) if d.size > 1 else float("nan")
        lines.append(f"| {r['variant']} | {r['kernels']} | {_fmt(r['bits_per_weight'], '.3f')} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['val_loss']:.4f} | {d.mean():+.4f} ± {_fmt(2 * se, '.4f')} | {r['val_ppl']:.3f} | "
                     f"{100 * (r['val_ppl'] / ref - 1):+.2f}% |")
    lines += ["", f"Quantization error on this model (pooled over the same kernels; activations: the inputs of "
              f"those Dense layers on the first {meta['batch_size']} windows, quantized along K). "
              "SQNR = 10 log10(sum x^2 / sum err^2); min over kernels in brackets.", "",
              "| format | kernels | weight SQNR dB | weight MSE | activation SQNR dB | activation MSE |",
              "|---|---|---|---|---|---|"]
    for e in errors:
        w, a = e["weights"], e["activations"]
        lines.append(f"| {e['variant']} | {w['num_kernels']}/{w['num_dense_kernels']} | {_fmt(w['sqnr_db'], '.2f')} "
                     f"({_fmt(w['min_sqnr_db'], '.2f')}) | {_fmt(w['mse'], '.3e')} | {_fmt(a['sqnr_db'], '.2f')} | "
                     f"{_fmt(a['mse'], '.3e')} |")
    return "\n".join(lines) + "\n"


def main(argv):
    cfg = apply_overrides(get_config(), argv)
    config, rows, errors, n = measure(cfg)
    meta = {"command": " ".join(["python", "experiments/fp4_perplexity/run.py"] + [shlex.quote(a) for a in argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "jax_version": jax.__version__, "backend": jax.default_backend(), "model": cfg.model, "impl": cfg.impl,
            "num_windows": n, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "val_tokens": rows[0]["val_tokens"],
            "model_config": dataclasses.asdict(config)}
    os.makedirs(cfg.out_dir, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", cfg.model.strip("/") + ("" if cfg.impl == "reference" else f"_{cfg.impl}"))
    with open(os.path.join(cfg.out_dir, f"results_{slug}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "errors": errors}, f, indent=2)
    sections = []
    for path in sorted(glob.glob(os.path.join(cfg.out_dir, "results_*.json"))):
        with open(path) as f:
            res = json.load(f)
        sections.append(markdown(res["rows"], res["errors"], res["meta"]))
    text = "# FP4 perplexity: float vs NVFP4 / MXFP4 / FP8 / INT4 weights (and W4A4)\n\n" + "\n".join(sections)
    results_md = os.path.join(cfg.out_dir, "RESULTS.md")
    if os.path.exists(results_md):  # hand-written reading of the figures survives a re-run
        with open(results_md) as f:
            old = f.read()
        if NOTES in old:
            text += "\n" + old[old.index(NOTES):]
    with open(results_md, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
