"""Strict typed checks for values a user passes in (host, no JAX).

Each check names the field and the offending value: ``SamplingParams.temperature must be a
finite number >= 0, got nan``. Integers are integers (``bool`` and ``float`` are refused, NumPy
integers accepted); numbers are finite reals; flags are ``bool``. Type errors raise ``TypeError``,
range errors ``ValueError``; each check returns the value as a plain Python ``int``/``float``.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

import numpy as np


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_int(field: str, value: Any, lo: int | None = None, hi: int | None = None, *,
              optional: bool = False) -> int | None:
    """``value`` as an ``int`` in ``[lo, hi)`` (either bound may be None); None allowed if ``optional``."""
    if value is None and optional:
        return None
    if not is_int(value):
        what = "an integer or None" if optional else "an integer"
        raise TypeError(f"{field} must be {what}, got {value!r} ({type(value).__name__})")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value >= hi):
        raise ValueError(f"{field} must be {_range(lo, hi)}, got {value}")
    return value


def check_number(field: str, value: Any, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False) -> float:
    """``value`` as a finite ``float`` with ``lo <= value <= hi`` (``lo < value`` if ``lo_open``)."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{field} must be a finite number, got {value!r} ({type(value).__name__})")
    value = float(value)
    below = lo is not None and (value <= lo if lo_open else value < lo)
    if not math.isfinite(value) or below or (hi is not None and value > hi):
        bounds = [f"> {lo:g}" if lo_open else f">= {lo:g}"] if lo is not None else []
        bounds += [f"<= {hi:g}"] if hi is not None else []
        raise ValueError(f"{field} must be a finite number{' ' if bounds else ''}{' and '.join(bounds)}, "
                         f"got {value!r}")
    return value


def check_bool(field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{field} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_choice(field: str, value: Any, choices: tuple) -> Any:
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise ValueError(f"{field} must be one of {choices}, got {value!r}")
    return value


def check_token_ids(field: str, ids: Any, vocab_size: int | None = None) -> list[int]:
    """A sequence of token ids (ints in ``[0, vocab_size)``), not a string, bytes or a scalar."""
    if isinstance(ids, (str, bytes, bytearray, memoryview)) or not isinstance(ids, Iterable) \
            or isinstance(ids, (dict, set, frozenset)):
        raise TypeError(f"{field} must be a list of token ids (ints), got {type(ids).__name__} {_short(ids)}")
    out = []
    for j, t in enumerate(ids):
        if not is_int(t):
            raise TypeError(f"{field}: token {j} must be an integer id, got {t!r} ({type(t).__name__})")
        t = int(t)
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            raise ValueError(f"{field}: token id {t} is outside the vocabulary [0, {vocab_size})"
                             if vocab_size is not None else f"{field}: token id {t} must be >= 0")
        out.append(t)
    return out


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"in [{lo}, {_pow2(hi)})"
    return f">= {lo}" if lo is not None else f"< {_pow2(hi)}"


def _pow2(x: int) -> str:
    return f"2**{x.bit_length() - 1}" if x > 1024 and x & (x - 1) == 0 else str(x)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
