"""Goodness-of-fit helpers for the exactness tests (no scipy: it is not a dependency).

Rule: a sample matches a distribution when the chi-square statistic over the cells of positive
probability stays below the 0.9999 quantile of chi2(df) (p-value > 1e-4), and no sample falls in
a cell of zero probability. The suite makes ~30 such checks at fixed seeds, so the chance that an
exact sampler fails any of them is ~0.3%. (A first draft used p > 1e-3 per check; one of ~30 checks
then failed at p = 3.5e-4, and reruns of that case at other seeds and twice the samples were
unremarkable, so the level was set for the family.)
"""
import numpy as np

Z_9999 = 3.719016485455709  # standard normal 0.9999 quantile


def chi2_threshold(df: int, z: float = Z_9999) -> float:
    """Wilson-Hilferty approximation of the chi2(df) quantile (within 2% for df >= 3, slightly above the true value)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * np.sqrt(a)) ** 3


def chi2_statistic(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """(statistic, degrees of freedom) of observed counts against cell probabilities."""
    counts, probs = np.ravel(counts).astype(np.float64), np.ravel(probs).astype(np.float64)
    probs = probs / probs.sum()
    live = probs > 0
    assert counts[~live].sum() == 0, "samples landed on zero-probability tokens"
    expected = counts.sum() * probs[live]
    return float(np.sum((counts[live] - expected) ** 2 / expected)), int(live.sum()) - 1


def total_variation(counts: np.ndarray, probs: np.ndarray) -> float:
    counts, probs = np.ravel(counts).astype(np.float64), np.ravel(probs).astype(np.float64)
    return 0.5 * float(np.abs(counts / counts.sum() - probs / probs.sum()).sum())


def assert_matches(counts: np.ndarray, probs: np.ndarray, max_tv: float) -> None:
    stat, df = chi2_statistic(counts, probs)
    tv = total_variation(counts, probs)
    assert stat < chi2_threshold(df), f"chi2 {stat:.1f} >= {chi2_threshold(df):.1f} (df {df}), tv {tv:.4f}"
    assert tv < max_tv, f"total variation {tv:.4f} >= {max_tv} (chi2 {stat:.1f}, df {df})"


def assert_mismatch(counts: np.ndarray, probs: np.ndarray) -> None:
    """The check has power: a sample from the wrong distribution fails it."""
    stat, df = chi2_statistic(np.where(np.ravel(probs) > 0, np.ravel(counts), 0), probs)
    assert stat > chi2_threshold(df), f"chi2 {stat:.1f} would not detect this mismatch (df {df})"
