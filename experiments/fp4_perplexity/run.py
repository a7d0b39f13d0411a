"""FP4 perplexity: float vs NVFP4 / MXFP4 / FP8 / INT4 weights (and W4A4) on the zoo models.

    python -m experiments.fp4_perplexity [key=value ...]    e.g. models=[jaxserve/tiny-code-draft] num_windows=8

Weights-only variants quantize every Dense kernel but embed/lm_head (``quantize_params`` defaults)
and compute in float32; "_w4a4" variants also fake-quantize each Dense input to the weight's
format. Also reports the quantization error (pooled MSE/SQNR) of the same kernels' weights and of
their inputs (activations of the first batch of validation windows, float32 model).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.loading import resolve_model
from jaxserve.quant import MatmulSettings, kernel_plan, quantization_report, quantize_params, weight_bytes
from jaxserve.quant.evaluate import activation_error, dense_inputs, perplexity, weight_error
from jaxserve.train.data import encode_split, windows
from pallas_kernels.fp4.quant_error import VARIANTS


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


def baseline_row(dtype, config, params, val, cfg):
    c = dataclasses.replace(config, dtype=dtype)
    p = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
    return {**perplexity(p, c, val, None, cfg.batch_size), "variant": dtype, "bytes": weight_bytes(p),
            "bits_per_weight": 8 * jnp.dtype(dtype).itemsize, "kernels": "none"}


def load(model, cfg):
    """(config, params, validation windows i32[W, seq_len + 1]) of a zoo model or checkpoint."""
    config, params, tokenizer = resolve_model(model)
    if tokenizer is None:
        raise ValueError(f"{model} has no tokenizer.json: cannot build validation windows")
    val = windows(encode_split(tokenizer, None, "val"), cfg.seq_len)
    return config, params, val[:cfg.num_windows] if cfg.num_windows else val


def describe(c):
    return (f"{c.model_type}, hidden {c.hidden_size}, {c.num_layers} layers, MLP {c.intermediate_size}, "
            f"vocab {c.vocab_size}, {'tied' if c.tie_word_embeddings else 'untied'} embeddings")


def with_paired_delta(rows):
    """Adds Δ loss against rows[0] on the same windows: mean and 2 standard errors of the per-window difference."""
    for r in rows:
        d = np.asarray(r["window_loss"]) - np.asarray(rows[0]["window_loss"])
        r["delta_loss"] = float(d.mean())
        r["delta_loss_2se"] = float(2 * d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
        r["ppl_vs_ref_pct"] = 100 * (r["val_ppl"] / rows[0]["val_ppl"] - 1)
    return rows


def _fmt(x, spec):
    return "n/a" if x is None or x != x else format(x, spec)  # NaN/None: the format selects no kernel here


PPL_COLUMNS = {"variant": "variant", "kernels": "kernels", "bits_per_weight": "bits/weight", "bytes": "MB",
               "val_loss": "val loss", "delta_loss": "Δ loss", "val_ppl": "val ppl", "ppl_vs_ref_pct": "ppl vs ref"}
PPL_FMT = {"bits_per_weight": lambda r: _fmt(r["bits_per_weight"], ".3f"), "bytes": lambda r: f"{r['bytes'] / 1e6:.2f}",
           "val_loss": ".4f", "delta_loss": lambda r: f"{r['delta_loss']:+.4f} ± {_fmt(r['delta_loss_2se'], '.4f')}",
           "val_ppl": ".3f", "ppl_vs_ref_pct": "+.2f"}
ERROR_COLUMNS = {"variant": "format", "kernels": "kernels", "weight_sqnr": "weight SQNR dB", "weight_mse": "weight MSE",
                 "act_sqnr": "activation SQNR dB", "act_mse": "activation MSE"}
ERROR_FMT = {"kernels": lambda e: f"{e['weights']['num_kernels']}/{e['weights']['num_dense_kernels']}",
             "weight_sqnr": lambda e: (f"{_fmt(e['weights']['sqnr_db'], '.2f')} "
                                       f"({_fmt(e['weights']['min_sqnr_db'], '.2f')})"),
             "weight_mse": lambda e: _fmt(e["weights"]["mse"], ".3e"),
             "act_sqnr": lambda e: _fmt(e["activations"]["sqnr_db"], ".2f"),
             "act_mse": lambda e: _fmt(e["activations"]["mse"], ".3e")}


def report_model(out, model, config, val, rows, errors, cfg):
    ref = rows[0]
    out.text(f"## {model} (impl {cfg.impl})\n\n"
             f"{ref['val_tokens']} predicted tokens ({len(val)} validation windows of {cfg.seq_len + 1} tokens). "
             f"Model: {describe(config)}; {ref['variant']} params {ref['bytes'] / 1e6:.2f} MB. "
             "Weights-only rows quantize every Dense kernel but embed/lm_head (\"kernels\": quantized/all) and "
             "compute in float32; `_w4a4` rows also fake-quantize each Dense input (NVFP4: one tensor scale per "
             "Dense call over the whole batch). bits/weight counts codes + block scales + tensor scale of the "
             f"quantized kernels; MB is the whole params pytree. Δ loss is paired against {ref['variant']} on the "
             "same windows: mean ± 2 standard errors of the per-window difference; ppl vs ref in %.")
    out.table(f"ppl/{model}", rows, PPL_COLUMNS, fmt=PPL_FMT)
    out.text(f"Quantization error on {model} (pooled over the same kernels; activations: the inputs of those "
             f"Dense layers on the first {cfg.batch_size} windows, quantized along K). "
             "SQNR = 10 log10(sum x^2 / sum err^2); min over kernels in brackets.")
    out.table(f"errors/{model}", errors, ERROR_COLUMNS, fmt=ERROR_FMT)


def plot(ax, results):
    for model, rows in results.items():
        qs = [r for r in rows if r["kernels"] != "none"]
        ax.bar([f"{r['variant']}\n{model.split('/')[-1]}" for r in qs], [r["ppl_vs_ref_pct"] for r in qs])
    ax.set_ylabel("perplexity vs unquantized (%)")
    ax.tick_params(axis="x", labelrotation=90, labelsize="small")


def run(cfg, out):
    units = [(m, n) for m in cfg.models for n in (*cfg.baselines, *cfg.variants)]
    loaded, results, model_configs = {}, {}, {}
    for model, name in out.progress(units, desc="model x variant"):
        if model not in loaded:
            loaded = {model: load(model, cfg)}  # one model in memory at a time
            model_configs[model] = dataclasses.asdict(loaded[model][0])
            out.json("model_configs", model_configs)
        config, params, val = loaded[model]
        rows = results.setdefault(model, [])
        rows.append(baseline_row(name, config, params, val, cfg) if name in cfg.baselines
                    else measure_variant(name, config, params, val, cfg))
        if len(rows) == len(cfg.baselines) + len(cfg.variants):
            report_model(out, model, config, val, with_paired_delta(rows),
                         measure_errors(config, params, val, cfg), cfg)
    with out.figure("ppl_vs_ref", f"Perplexity change vs {cfg.baselines[0]} per format (impl {cfg.impl})") as ax:
        plot(ax, results)


if __name__ == "__main__":  # an alias of python -m experiments.fp4_perplexity
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from experiments.harness import main
    main("fp4_perplexity")
