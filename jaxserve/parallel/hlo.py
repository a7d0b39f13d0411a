"""Collectives in a compiled program: what a layout moves between devices, read from the HLO text.

``collectives(jitted.lower(...).compile().as_text())`` -> ``{op: Collective(count, bytes)}`` for
all-reduce, all-gather, all-to-all, reduce-scatter and collective-permute (async ``-start`` halves
counted once). ``bytes`` sums each op's result shapes: per device, what one execution of the
program produces through that collective.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

OPS = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")
_LINE = re.compile(r"=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(OPS) + r")(?:-start)?\(")
_SHAPE = re.compile(r"\b(?P<dtype>pred|[subf]\d+|bf16|f8\w*)\[(?P<dims>[\d,]*)\]")
_BYTES = {"pred": 1, "bf16": 2}


@dataclass(frozen=True)
class Collective:
    count: int
    bytes: int


def _shape_bytes(dtype: str, dims: str) -> int:
    size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    width = _BYTES.get(dtype) or max(1, int(re.sub(r"\D", "", dtype)[:2] or 8) // 8)
    return size * width


def collectives(hlo_text: str) -> dict[str, Collective]:
    """Count and result bytes of each collective op in ``hlo_text`` (ops absent from it are absent here)."""
    out: dict[str, list[int]] = {}
    for line in hlo_text.splitlines():
        m = _LINE.search(line)
        if m is None:
            continue
        if m.group("type").startswith("(") and "-start" in line:  # async start: (operands, results) tuple
            shapes = _SHAPE.findall(m.group("type"))
            shapes = shapes[len(shapes) // 2:]
        else:
            shapes = _SHAPE.findall(m.group("type"))
        c = out.setdefault(m.group("op"), [0, 0])
        c[0] += 1
        c[1] += sum(_shape_bytes(d, s) for d, s in shapes)
    return {op: Collective(*v) for op, v in out.items()}


def gathers_of(hlo_text: str, dims: tuple[int, ...]) -> list[str]:
    """The all-gather lines whose result has shape ``dims`` (e.g. a KV pool layer's: none should)."""
    want = ",".join(map(str, dims))
    return [line.strip() for line in hlo_text.splitlines()
            if "all-gather" in line and _LINE.search(line) and f"[{want}]" in line]
