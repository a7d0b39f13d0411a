"""Quantization error: NVFP4 vs MXFP4 (both scale rules) vs FP8 vs INT4-g128 on synthetic matrices.

    python -m experiments.fp4_quant_error [key=value ...]     e.g. rows=512 cols=512 seeds=[0]

MSE and SQNR per format and distribution (mean over seeds). Synthetic matrices only; model weights
go through the same `pallas_kernels.fp4.quant_error.quantization_error(array, variant)`
(see experiments/fp4_perplexity).
"""
import itertools

import numpy as np

from pallas_kernels.fp4.quant_error import quantization_error


def synthetic_matrix(distribution, shape, seed):
    """f32[shape] with unit scale: "gaussian" or "student_t<df>"."""
    rng = np.random.default_rng(seed)
    if distribution == "gaussian":
        return rng.standard_normal(shape).astype(np.float32)
    if distribution.startswith("student_t"):
        return rng.standard_t(float(distribution[len("student_t"):]), shape).astype(np.float32)
    raise ValueError(f"unknown distribution {distribution!r}")


def measure(cfg, progress=iter):
    """One row per (distribution, variant): MSE and SQNR averaged over cfg.seeds."""
    per = {}  # (distribution, seed) -> {variant: quantization_error(...)}
    for dist, s in progress(list(itertools.product(cfg.distributions, cfg.seeds))):
        per[dist, s] = {v: quantization_error(synthetic_matrix(dist, (cfg.rows, cfg.cols), s), v) for v in cfg.variants}
    rows = []
    for dist in cfg.distributions:
        for v in cfg.variants:
            sqnr = [per[dist, s][v]["sqnr_db"] for s in cfg.seeds]
            mse = [per[dist, s][v]["mse"] for s in cfg.seeds]
            rows.append({"distribution": dist, "variant": v, "mse": float(np.mean(mse)),
                         "sqnr_db": float(np.mean(sqnr)), "sqnr_db_min": min(sqnr), "sqnr_db_max": max(sqnr),
                         "bits_per_element": per[dist, cfg.seeds[0]][v]["bits_per_element"]})
    return rows


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


def plot(ax, rows, cfg):
    width = 0.8 / len(cfg.variants)
    for i, v in enumerate(cfg.variants):
        ys = [next(r["sqnr_db"] for r in rows if r["distribution"] == d and r["variant"] == v)
              for d in cfg.distributions]
        ax.bar(np.arange(len(cfg.distributions)) + i * width, ys, width, label=v)
    ax.set_xticks(np.arange(len(cfg.distributions)) + 0.4 - width / 2, cfg.distributions)
    ax.set_ylabel("SQNR (dB, higher is better)")
    ax.set_ylim(0, 1.3 * max(r["sqnr_db"] for r in rows))  # room for the legend
    ax.legend(fontsize="small", ncols=3)


def run(cfg, out):
    rows = measure(cfg, lambda units: out.progress(units, desc="matrices"))
    out.text(f"Matrices {cfg.rows}x{cfg.cols} quantized along axis 0, seeds {list(cfg.seeds)}. "
             "SQNR = 10 log10(sum x^2 / sum (x - x_hat)^2), mean over seeds (min..max in brackets); "
             "MSE is for unit-scale inputs. Bits per element count codes, block scales and the tensor scale.")
    out.table("sqnr", rows, {"distribution": "distribution", "variant": "variant", "bits_per_element": "bits/elem",
                             "mse": "MSE", "sqnr_db": "SQNR dB"},
              fmt={"bits_per_element": ".3f", "mse": ".4e",
                   "sqnr_db": lambda r: f"{r['sqnr_db']:.2f} ({r['sqnr_db_min']:.2f}..{r['sqnr_db_max']:.2f})"})
    out.text("\n".join(gap_summary(rows)))
    with out.figure("sqnr", "SQNR per format and weight distribution") as ax:
        plot(ax, rows, cfg)


if __name__ == "__main__":  # an alias of python -m experiments.fp4_quant_error
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from experiments.harness import main
    main("fp4_quant_error")
