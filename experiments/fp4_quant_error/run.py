"""Quantization error (MSE, SQNR) of NVFP4 vs MXFP4 (both scale rules) vs FP8 vs INT4-g128.

    python experiments/fp4_quant_error/run.py [key=value ...]     e.g. rows=512 cols=512 seeds=[0]

Writes results.json and RESULTS.md into cfg.out_dir. Synthetic matrices only for now; model
weights go through the same `pallas_kernels.fp4.quant_error.quantization_error(array, variant)`.
"""
import datetime
import json
import os
import shlex
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config import get_config  # noqa: E402

from jaxserve.config import apply_overrides  # noqa: E402
from pallas_kernels.fp4.quant_error import quantization_error  # noqa: E402


def synthetic_matrix(distribution, shape, seed):
    """f32[shape] with unit scale: "gaussian" or "student_t<df>"."""
    rng = np.random.default_rng(seed)
    if distribution == "gaussian":
        return rng.standard_normal(shape).astype(np.float32)
    if distribution.startswith("student_t"):
        return rng.standard_t(float(distribution[len("student_t"):]), shape).astype(np.float32)
    raise ValueError(f"unknown distribution {distribution!r}")


def measure(cfg):
    rows = []
    for dist in cfg.distributions:
        per_seed = [{v: quantization_error(synthetic_matrix(dist, (cfg.rows, cfg.cols), s), v) for v in cfg.variants}
                    for s in cfg.seeds]
        for v in cfg.variants:
            sqnr = [r[v]["sqnr_db"] for r in per_seed]
            mse = [r[v]["mse"] for r in per_seed]
            rows.append({"distribution": dist, "variant": v, "mse": float(np.mean(mse)),
                         "sqnr_db": float(np.mean(sqnr)), "sqnr_db_min": min(sqnr), "sqnr_db_max": max(sqnr),
                         "bits_per_element": per_seed[0][v]["bits_per_element"]})
    return rows


def markdown(rows, meta):
    lines = [
        "# Quantization error: NVFP4 vs MXFP4 vs FP8 vs INT4-g128 (synthetic matrices)", "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; JAX {meta['jax_version']} ({meta['backend']}); "
        f"matrices {meta['shape'][0]}x{meta['shape'][1]} quantized along axis 0, seeds {meta['seeds']}.", "",
        "SQNR = 10 log10(sum x^2 / sum (x - x_hat)^2), mean over seeds (min..max in brackets); "
        "MSE is for unit-scale inputs. Bits per element count codes, block scales and the tensor scale.", "",
        "| distribution | variant | bits/elem | MSE | SQNR dB |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['distribution']} | {r['variant']} | {r['bits_per_element']:.3f} | {r['mse']:.4e} | "
                     f"{r['sqnr_db']:.2f} ({r['sqnr_db_min']:.2f}..{r['sqnr_db_max']:.2f}) |")
    lines += ["", *gap_summary(rows)]
    return "\n".join(lines) + "\n"


def gap_summary(rows):
    """One line per distribution: SQNR of NVFP4 minus that of each other 4-bit variant."""
    out = []
    for dist in dict.fromkeys(r["distribution"] for r in rows):
        by = {r["variant"]: r["sqnr_db"] for r in rows if r["distribution"] == dist}
        if "nvfp4" in by:
            gaps = ", ".join(f"{v} {by['nvfp4'] - s:+.2f} dB" for v, s in by.items()
                             if v != "nvfp4" and not v.startswith("fp8"))
            out.append(f"- {dist}: NVFP4 SQNR minus {gaps}.")
    return out


def main(argv):
    cfg = apply_overrides(get_config(), argv)
    rows = measure(cfg)
    meta = {"command": " ".join(["python", "experiments/fp4_quant_error/run.py"] + [shlex.quote(a) for a in argv]),
            "date": datetime.date.today().isoformat(), "jax_version": jax.__version__,
            "backend": jax.default_backend(), "shape": [cfg.rows, cfg.cols], "seeds": list(cfg.seeds)}
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    text = markdown(rows, meta)
    with open(os.path.join(cfg.out_dir, "RESULTS.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
