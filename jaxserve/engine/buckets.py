"""Shape buckets: a long workload compiles a bounded, known set of programs (host, no JAX)."""
from __future__ import annotations


def powers_of_two(lo: int, hi: int) -> list[int]:
    """[lo, 2lo, 4lo, ...] up to the first value >= hi (always includes a value >= hi)."""
    out = [max(lo, 1)]
    while out[-1] < hi:
        out.append(out[-1] * 2)
    return out


def bucket(value: int, buckets: list[int]) -> int:
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")
