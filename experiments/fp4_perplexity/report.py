"""Tables, text and the figure of the FP4 perplexity experiment (numbers in, markdown out).

Every comparison between two rows is paired on the same windows: the mean and 2 standard errors of
the per-window difference of mean NLL; a perplexity ratio is exp of that difference.
"""
import math

import numpy as np

FP8_REFERENCE = "fp8_tensor"  # NVIDIA's FP8 (per-tensor scale) against which NVFP4 is "within ~1%"
BF16_REFERENCE = "bfloat16"


def paired(row, ref) -> tuple[float, float]:
    """(mean, 2 standard errors) of row's per-window loss minus ref's."""
    d = np.asarray(row["window_loss"]) - np.asarray(ref["window_loss"])
    return float(d.mean()), float(2 * d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else math.nan


def pct(delta: float) -> float:
    return 100 * math.expm1(delta)


def with_paired_delta(rows):
    """Adds Δ loss against rows[0] (mean, 2 SE) and the perplexity change in %."""
    for r in rows:
        r["delta_loss"], r["delta_loss_2se"] = paired(r, rows[0])
        r["ppl_vs_ref_pct"] = 100 * (r["val_ppl"] / rows[0]["val_ppl"] - 1)
    return rows


def _versus(row, ref, key):
    if ref is None:
        return {f"vs_{key}_pct": math.nan, f"vs_{key}_lo": math.nan, f"vs_{key}_hi": math.nan}
    d, se = paired(row, ref)
    return {f"vs_{key}_pct": pct(d), f"vs_{key}_lo": pct(d - se), f"vs_{key}_hi": pct(d + se)}


def claim_rows(by_source: dict) -> list[dict]:
    """Per source and quantized variant: perplexity change vs the bfloat16 row and vs fp8_tensor, with 2-SE bands."""
    rows = []
    for source, table in by_source.items():
        named = {r["variant"]: r for r in table}
        for r in table:
            if r["kernels"] != "none":
                rows.append({"source": source, "variant": r["variant"], "val_ppl": r["val_ppl"],
                             **_versus(r, named.get(BF16_REFERENCE), "bf16"),
                             **_versus(r, named.get(FP8_REFERENCE), "fp8")})
    return rows


def source_rows(by_source: dict) -> list[dict]:
    """Per variant: perplexity from each weight source, and each later source's paired Δ loss vs the first."""
    first, *rest = by_source
    rows = []
    for i, r in enumerate(by_source[first]):
        row = {"variant": r["variant"], f"ppl_{first}": r["val_ppl"]}
        for src in rest:
            other = by_source[src][i]
            row[f"ppl_{src}"] = other["val_ppl"]
            row[f"delta_{src}"], row[f"delta_{src}_2se"] = paired(other, r)
        rows.append(row)
    return rows


def _fmt(x, spec):
    return "n/a" if x is None or x != x else format(x, spec)  # NaN/None: the format selects no kernel here


def _band(r, key):
    if r[f"vs_{key}_pct"] != r[f"vs_{key}_pct"]:
        return "n/a"
    return f"{r[f'vs_{key}_pct']:+.2f} [{r[f'vs_{key}_lo']:+.2f}, {r[f'vs_{key}_hi']:+.2f}]"


PPL_COLUMNS = {"variant": "variant", "kernels": "kernels", "bits_per_weight": "bits/weight", "bytes": "MB",
               "val_loss": "val loss", "delta_loss": "Δ loss", "val_ppl": "val ppl", "ppl_vs_ref_pct": "ppl vs ref"}
PPL_FMT = {"bits_per_weight": lambda r: _fmt(r["bits_per_weight"], ".3f"), "bytes": lambda r: f"{r['bytes'] / 1e6:.2f}",
           "val_loss": ".4f", "delta_loss": lambda r: f"{r['delta_loss']:+.4f} ± {_fmt(r['delta_loss_2se'], '.4f')}",
           "val_ppl": ".3f", "ppl_vs_ref_pct": "+.2f"}
CLAIM_COLUMNS = {"source": "weights from", "variant": "variant", "val_ppl": "val ppl",
                 "vs_bf16": "ppl vs bfloat16 % [± 2 SE]", "vs_fp8": f"ppl vs {FP8_REFERENCE} % [± 2 SE]"}
CLAIM_FMT = {"val_ppl": ".3f", "vs_bf16": lambda r: _band(r, "bf16"), "vs_fp8": lambda r: _band(r, "fp8")}
ERROR_COLUMNS = {"variant": "format", "kernels": "kernels", "weight_sqnr": "weight SQNR dB", "weight_mse": "weight MSE",
                 "act_sqnr": "activation SQNR dB", "act_mse": "activation MSE"}
ERROR_FMT = {"kernels": lambda e: f"{e['weights']['num_kernels']}/{e['weights']['num_dense_kernels']}",
             "weight_sqnr": lambda e: (f"{_fmt(e['weights']['sqnr_db'], '.2f')} "
                                       f"({_fmt(e['weights']['min_sqnr_db'], '.2f')})"),
             "weight_mse": lambda e: _fmt(e["weights"]["mse"], ".3e"),
             "act_sqnr": lambda e: _fmt(e["activations"]["sqnr_db"], ".2f"),
             "act_mse": lambda e: _fmt(e["activations"]["mse"], ".3e")}
KERNEL_COLUMNS = {"variant": "variant", "layer": "layer", "M": "M", "K": "K", "N": "N",
                  "rel_diff": "Pallas vs reference", "nudge_rel_diff": "reference vs 1e-6-nudged input"}
KERNEL_FMT = {"rel_diff": ".2e", "nudge_rel_diff": ".2e"}


def describe(c):
    return (f"{c.model_type}, hidden {c.hidden_size}, {c.num_layers} layers, MLP {c.intermediate_size}, "
            f"vocab {c.vocab_size}, {'tied' if c.tie_word_embeddings else 'untied'} embeddings")


def _source_table(out, model, by_source):
    first, *rest = by_source
    cols = {"variant": "variant", f"ppl_{first}": f"ppl from {first}"}
    fmt = {f"ppl_{first}": ".3f"}
    for src in rest:
        cols[f"ppl_{src}"], fmt[f"ppl_{src}"] = f"ppl from {src}-rounded", ".3f"
        cols[f"delta_{src}"] = f"Δ loss ({src} − {first})"
        fmt[f"delta_{src}"] = lambda r, s=src: f"{r[f'delta_{s}']:+.5f} ± {_fmt(r[f'delta_{s}_2se'], '.5f')}"
    out.text(f"Same rows from each weight source (Δ loss paired on the same windows, mean ± 2 SE):")
    out.table(f"sources/{model}", source_rows(by_source), cols, fmt=fmt)


def report_model(out, model, config, val, stream_len, by_source, claims, sources, errors, kernels, cfg):
    first = next(iter(by_source))
    ref = by_source[first][0]
    out.text(f"## {model} (impl {cfg.impl})\n\n"
             f"Text `{cfg.text}`: {stream_len} tokens; {ref['val_tokens']} predicted tokens in {len(val)} windows "
             f"of {cfg.seq_len + 1} tokens ({'evenly spaced over' if cfg.spread_windows else 'the start of'} the "
             f"text). Model: {describe(config)}; {ref['variant']} params {ref['bytes'] / 1e6:.2f} MB. "
             + ("Weights-only rows quantize every Dense kernel and the LM head (lm_head: the tied embedding along E; "
                "\"kernels\": Dense kernels quantized/all) and " if cfg.lm_head else
                "Weights-only rows quantize every Dense kernel but embed/lm_head (\"kernels\": quantized/all) and ") +
             "compute in float32; `_w4a4` rows also fake-quantize each Dense input (NVFP4: one tensor scale per "
             "Dense call over the whole batch); `_w4a8` rows quantize each Dense input to int8 on the weight's blocks "
             "(llama.cpp's Q8 rule, `activation_quantization=\"int8\"`)"
             + ("; every quantized row reads the LM head in int8 (`lm_head_quantization=\"int8\"`: one scale a "
                "vocabulary row, activations in int8 blocks of 32)" if cfg.int8_head else "")
             + ". bits/weight counts codes + block scales + tensor scale of the "
             f"quantized kernels; MB is the whole params pytree. Δ loss is paired against {ref['variant']} on the "
             "same windows: mean ± 2 standard errors of the per-window difference; ppl vs ref in %.")
    for source, rows in by_source.items():
        what = ("as loaded" if source == "float32" else f"rounded to {source} (a 16-bit export), computed in "
                f"float32 (the {source} baseline row, if any, is the same computation as from float32: run once)")
        out.text(f"### Weights {what}")
        out.table(f"ppl/{model}/{source}", rows, PPL_COLUMNS, fmt=PPL_FMT)
    if len(by_source) > 1:
        _source_table(out, model, by_source)
    out.text(f"NVIDIA's claim, paired per window: perplexity change against the {BF16_REFERENCE} row and against "
             f"{FP8_REFERENCE} (weights-only FP8, per-tensor scale) of the same weight source; "
             "in brackets exp(Δ loss ± 2 SE) − 1.")
    out.table(f"claim/{model}", claims, CLAIM_COLUMNS, fmt=CLAIM_FMT)
    out.text(f"Quantization error on {model} (weights {first}; pooled over the same kernels; activations: the inputs "
             f"of those Dense layers on the first {cfg.batch_size} windows, quantized along K). "
             "SQNR = 10 log10(sum x^2 / sum err^2); min over kernels in brackets.")
    out.table(f"errors/{model}", errors, ERROR_COLUMNS, fmt=ERROR_FMT)
    if kernels:
        out.text(f"Pallas FP4 matmul (interpret mode) vs the reference (dequantize, float32 dot) on real inputs: "
                 f"the first {cfg.kernel_check_tokens} tokens of the first window, weights {first}; "
                 "max |difference| / max |reference|. The last column is the reference against itself on an input "
                 "nudged by 1e-6 relative noise: the size of a rounding-level change.")
        out.table(f"kernel/{model}", kernels, KERNEL_COLUMNS, fmt=KERNEL_FMT)


def plot(ax, results):
    """Grouped bars: perplexity change vs each source's reference row, one group per variant."""
    for model, by_source in results.items():
        n = len(by_source)
        for i, (source, rows) in enumerate(by_source.items()):
            qs = [r for r in rows if r["kernels"] != "none"]
            x = np.arange(len(qs)) + (i - (n - 1) / 2) * 0.8 / n
            err = [100 * math.expm1(r["delta_loss_2se"]) for r in qs]
            label = f"{model.split('/')[-1]}, weights {source}"
            ax.bar(x, [r["ppl_vs_ref_pct"] for r in qs], width=0.8 / n, yerr=err, capsize=2, label=label)
        ax.set_xticks(np.arange(len(qs)), [r["variant"] for r in qs])
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("perplexity vs unquantized float32 (%)")
    ax.tick_params(axis="x", labelrotation=60, labelsize="small")
    ax.legend(fontsize="small")
