"""Token frequencies beside a draft's weights, for a draft restricted to the most frequent tokens (host side, no JAX).

``token_counts.json``: ``{"corpus": "<what was counted>", "counts": [one int per token id]}``, written by
``scripts/token_counts.py`` (the zoo's: the pycode-v1 training split). ``most_frequent`` picks the ids a
restricted draft may propose (``jaxserve.speculative.draft_vocab``).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

COUNTS_FILE = "token_counts.json"


def most_frequent(counts: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` most frequent token ids, i32[n] in ascending id order (equal counts: the lower id first)."""
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"token counts must be a non-empty 1-D array (one per token id), got shape {counts.shape}")
    if not isinstance(n, (int, np.integer)) or not 1 <= n <= counts.size:
        raise ValueError(f"draft_vocab_size must be an int in [1, {counts.size}] (the vocabulary), got {n!r}")
    ranked = np.argsort(-counts, kind="stable")  # stable: ties keep id order
    return np.sort(ranked[:n]).astype(np.int32)


def load_counts(directory: str | pathlib.Path, vocab_size: int) -> np.ndarray:
    """i64[vocab_size] counts from ``directory/token_counts.json``; a missing file or a wrong length is a ValueError."""
    path = pathlib.Path(directory) / COUNTS_FILE
    if not path.is_file():
        raise ValueError(f"draft_vocab_size needs token frequencies: {str(path)!r} does not exist "
                         f"(write it with scripts/token_counts.py)")
    counts = np.asarray(json.loads(path.read_text())["counts"], np.int64)
    if counts.shape != (vocab_size,):
        raise ValueError(f"{str(path)!r} has {counts.size} counts; the draft's vocabulary has {vocab_size} tokens")
    return counts


def write_counts(directory: str | pathlib.Path, counts: np.ndarray, corpus: str) -> pathlib.Path:
    path = pathlib.Path(directory) / COUNTS_FILE
    path.write_text(json.dumps({"corpus": corpus, "counts": [int(c) for c in counts]}) + "\n")
    return path
