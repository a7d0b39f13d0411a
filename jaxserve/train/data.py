"""Token streams and a deterministic, resumable batch order.

The split's documents are tokenized and concatenated, each followed by EOS (the separator), into
one stream; the stream is cut into non-overlapping windows of ``seq_len + 1`` tokens (stride
``seq_len``, so every token but the first is a target exactly once). Training visits windows in a
fresh permutation per epoch drawn from ``(seed, epoch)``; the batch of step ``s`` is a pure
function of ``(seed, s)``, so a resumed run sees exactly the data an uninterrupted one would.
"""
from __future__ import annotations

import numpy as np

from jaxserve.tokenizer import Tokenizer
from jaxserve.train.corpus import iter_documents


def encode_split(tokenizer: Tokenizer, corpus: str | None, split: str, max_tokens: int = 0) -> np.ndarray:
    """The split as one token stream i32[N], documents separated by EOS; truncated to max_tokens if > 0."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token to separate documents")
    ids = tokenizer.encode_batch(list(iter_documents(corpus or None, split)))
    stream = np.concatenate([np.asarray(d + [tokenizer.eos_token_id], np.int32) for d in ids])
    return stream[:max_tokens] if max_tokens else stream


def prompt_windows(tokenizer: Tokenizer | None, vocab_size: int, count: int, length: int, seed: int) -> np.ndarray:
    """i32[count, length] prompts: windows at random starts of the pycode val split's token stream (its
    first 200k tokens); without a tokenizer, random ids in [0, vocab_size). Seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    if tokenizer is None:
        return rng.integers(0, vocab_size, (count, length))
    stream = encode_split(tokenizer, None, "val", max_tokens=200_000)
    starts = rng.integers(0, len(stream) - length, count)
    return np.stack([stream[s:s + length] for s in starts])


def windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Non-overlapping windows i32[W, seq_len + 1] (stride seq_len) of a token stream."""
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError(f"token stream of {len(stream)} tokens is too short for one window of {seq_len + 1}")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return stream[idx]


def packed_windows(pieces: list, seq_len: int, pad_id: int) -> np.ndarray:
    """Windows i32[W, seq_len + 1] made of whole pieces (a prompt and its answer each): each piece goes into the
    first window with room for it (first fit), the rest of a window is ``pad_id``; a piece longer than a window
    is cut to it. Deterministic.

    Unlike ``windows``' cuts at every seq_len tokens, an answer here always sees its prompt, at the positions
    serving gives it (a draft that must copy from the prompt learns to)."""
    if not len(pieces):
        raise ValueError("packed_windows needs at least one piece")
    width = seq_len + 1
    rows, free = [], np.zeros(0, np.int64)
    for piece in pieces:
        piece = list(piece)[:width]
        fits = np.nonzero(free >= len(piece))[0]
        if fits.size:
            rows[fits[0]] += piece
            free[fits[0]] -= len(piece)
        else:
            rows.append(piece)
            free = np.append(free, width - len(piece))
    return np.asarray([row + [pad_id] * (width - len(row)) for row in rows], np.int32)


class BatchOrder:
    """Which windows make up each step's batch: epoch-wise permutations seeded by ``(seed, epoch)``."""

    def __init__(self, num_windows: int, batch_size: int, seed: int):
        self.num_windows, self.batch_size, self.seed = num_windows, batch_size, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)}
        return self._perms[epoch]

    def indices(self, step: int) -> np.ndarray:
        """Window indices i64[batch_size] of step ``step`` (sequence positions step*B .. step*B+B-1)."""
        pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
        return np.array([self._perm(int(p) // self.num_windows)[int(p) % self.num_windows] for p in pos])
