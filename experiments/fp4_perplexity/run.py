"""FP4 perplexity: float vs NVFP4 / MXFP4 / FP8 / INT4 weights (and W4A4), SmolLM2-135M or the zoo models.

    python -m experiments.fp4_perplexity [key=value ...]    e.g. num_windows=8 weight_sources=[float32]

Weights-only variants quantize every Dense kernel but embed/lm_head (``quantize_params`` defaults; ``lm_head=true``:
the LM head too, a tied one as the embedding table along E) and compute in float32; "_w4a4" variants also fake-quantize each Dense input to the weight's
format, "_w4a8" ones to int8 on the weight's blocks (``jaxserve.quant.w4a8``: what
``activation_quantization="int8"`` serves, llama.cpp's Q8 activations). Every row starts from one float tensor per weight (``weight_sources``): the weights as
loaded (SmolLM2: dequantized from its GGUF file's Q4_1 blocks to float32), or those rounded to
bfloat16 / float16 (a 16-bit export) and computed in float32. Also reports the quantization error
(pooled MSE/SQNR) of the kernels' weights and inputs, and the Pallas kernel against the reference
matmul on a few layers (``kernel_check.py``).
"""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments.fp4_perplexity.kernel_check import kernel_vs_reference, split_variant, variant_settings
from experiments.fp4_perplexity.report import claim_rows, plot, report_model, source_rows, with_paired_delta
from experiments.harness import ROOT
from jaxserve.models.loading import resolve_model
from jaxserve.kernels.cpu.int8_head import with_int8_head
from jaxserve.quant import kernel_plan, quantization_report, quantize_params, weight_bytes
from jaxserve.quant.evaluate import activation_error, dense_inputs, perplexity, weight_error
from jaxserve.train.data import encode_split, windows
from pallas_kernels.fp4.quant_error import VARIANTS

PYCODE_VAL = "pycode-val"
SOURCE_DTYPES = ("float32", "bfloat16", "float16")


def validate(cfg):
    """Errors a user can cause, raised before any model loads."""
    for name in cfg.variants:
        if split_variant(name)[0] not in VARIANTS:
            raise ValueError(f"variants: unknown variant {name!r}; expected a key of {sorted(VARIANTS)}, "
                             "optionally with the suffix '_w4a4' or '_w4a8'")
    for src in cfg.weight_sources:
        if src not in SOURCE_DTYPES:
            raise ValueError(f"weight_sources: {src!r} is not one of {SOURCE_DTYPES}")
    if not cfg.weight_sources or not cfg.baselines:
        raise ValueError(f"weight_sources ({cfg.weight_sources}) and baselines ({cfg.baselines}) must not be empty")
    text_files(cfg.text)


def text_files(text: str) -> list[str]:
    """The .txt files of config field ``text`` ([] for the pycode validation split)."""
    if text == PYCODE_VAL:
        return []
    path = os.path.join(ROOT, text)
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".txt")) \
        if os.path.isdir(path) else [path] if os.path.isfile(path) else []
    if not files:
        raise ValueError(f"text={text!r}: neither {PYCODE_VAL!r} nor a .txt file or a folder holding .txt files")
    return files


def text_stream(tokenizer, text: str) -> np.ndarray:
    """i32[N]: the text's documents tokenized, each followed by EOS."""
    if text == PYCODE_VAL:
        return encode_split(tokenizer, None, "val")
    docs = [open(f, encoding="utf-8").read() for f in text_files(text)]
    return np.concatenate([np.asarray(tokenizer.encode(d) + [tokenizer.eos_token_id], np.int32) for d in docs])


def pick_windows(val: np.ndarray, num: int, spread: bool) -> np.ndarray:
    if not num or num >= len(val):
        return val
    return val[np.linspace(0, len(val) - 1, num).round().astype(int)] if spread else val[:num]


def load(model, cfg):
    """(config, params, windows i32[W, seq_len + 1], stream length) of a model and the config's text."""
    config, params, tokenizer = resolve_model(model)
    if tokenizer is None:
        raise ValueError(f"{model} has no tokenizer: cannot tokenize text={cfg.text!r}")
    stream = text_stream(tokenizer, cfg.text)
    return config, params, pick_windows(windows(stream, cfg.seq_len), cfg.num_windows, cfg.spread_windows), len(stream)


def source_params(params, source: str):
    """params rounded to ``source`` and back to float32 (the tensors a 16-bit export would hold)."""
    if source == "float32":
        return params
    return jax.tree.map(lambda x: x.astype(jnp.dtype(source)).astype(jnp.float32), params)


def measure_variant(name, config, params, val, cfg):
    fmt, opts = VARIANTS[split_variant(name)[0]]
    qparams = quantize_params(params, fmt, lm_head=cfg.lm_head, **opts)
    if cfg.int8_head:  # what EngineConfig.lm_head_quantization="int8" serves (kernels.cpu.int8_head)
        qparams = with_int8_head(qparams, config.tie_word_embeddings)
    report = quantization_report(params, qparams)
    plan = kernel_plan(params, fmt, **opts)
    row = perplexity(qparams, config, val, variant_settings(cfg.impl, name), cfg.batch_size)
    bits = report.bits_per_quantized_weight if report.num_quantized else float("nan")
    return {**row, "variant": name, "bytes": report.bytes_after, "bits_per_weight": bits,
            "kernels": f"{report.num_quantized}/{len(plan)}"}


def baseline_row(dtype, config, params, val, cfg):
    c = dataclasses.replace(config, dtype=dtype)
    p = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
    return {**perplexity(p, c, val, None, cfg.batch_size), "variant": dtype, "bytes": weight_bytes(p),
            "bits_per_weight": 8 * jnp.dtype(dtype).itemsize, "kernels": "none"}


def measure_errors(config, params, val, cfg):
    """Weight and activation quantization error of each base format of cfg.variants."""
    inputs = dense_inputs(params, config, val[:cfg.batch_size, :-1])
    names = dict.fromkeys(split_variant(v)[0] for v in cfg.variants)
    return [{"variant": v, "weights": weight_error(params, v), "activations": activation_error(inputs, v)}
            for v in names]


def measure_model(model, cfg, out):
    config, params, val, stream_len = load(model, cfg)
    out.json("model_configs", {**out.results.get("model_configs", {}), model: dataclasses.asdict(config)})
    by_source, done = {}, {}
    names = (*cfg.baselines, *cfg.variants)
    for source, name in out.progress([(s, n) for s in cfg.weight_sources for n in names], desc=model):
        # a baseline in the source's own dtype computes on the same tensors from either source: run it once
        key = ("float32" if name == source else source, name)
        if key not in done:
            p = source_params(params, source)
            done[key] = (baseline_row(name, config, p, val, cfg) if name in cfg.baselines
                         else measure_variant(name, config, p, val, cfg))
        rows = by_source.setdefault(source, [])
        rows.append(dict(done[key]))
        if len(rows) == len(names):
            with_paired_delta(rows)
    kernel_rows = []
    if cfg.kernel_check_tokens and cfg.kernel_check_layers:
        kernel_rows = kernel_vs_reference(params, config, val[:1, :cfg.kernel_check_tokens],
                                          cfg.kernel_check_layers, cfg.variants)
    report_model(out, model, config, val, stream_len, by_source, claim_rows(by_source),
                 source_rows(by_source), measure_errors(config, params, val, cfg), kernel_rows, cfg)
    return by_source


def run(cfg, out):
    validate(cfg)
    results = {model: measure_model(model, cfg, out) for model in cfg.models}
    with out.figure("ppl_vs_ref", f"Perplexity change vs {cfg.baselines[0]} per format, ± 2 standard errors "
                    f"of the per-window paired difference (impl {cfg.impl})", figsize=(8, 4.6)) as ax:
        plot(ax, results)


if __name__ == "__main__":  # an alias of python -m experiments.fp4_perplexity
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from experiments.harness import main
    main("fp4_perplexity")
