"""Shape buckets: a long workload compiles a bounded, known set of programs (host, no JAX; used by the engine and by speculative_generate)."""
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


def half_octaves(lo: int, hi: int) -> list[int]:
    """[lo, 1.5lo, 2lo, 3lo, 4lo, ...] up to the first value >= hi: at most 1/3 of a padded batch is waste."""
    out = [max(lo, 1)]
    while out[-1] < hi:
        x = out[-1]
        up = x + x // 2 if (x & (x - 1)) == 0 and x >= 2 else 2 ** x.bit_length()  # 2^k -> 1.5 * 2^k -> 2^(k+1)
        out.append(up)
    return out


def decode_batch_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes for decode programs: 1, 2, 4, then half octaves from 8 (vLLM captures CUDA graphs
    for 1, 2, 4, 8, 16, 24, ...). The small ones are for latency at low load: on CPU a lone
    tiny-code sequence decoded in an 8-row program took ~4.0 ms a step, in a 1-row one ~2.0 ms."""
    return [b for b in (1, 2, 4) if b < max_num_seqs] + half_octaves(min(8, max_num_seqs), max_num_seqs)
