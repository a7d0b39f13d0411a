"""This machine's memory-bandwidth ceiling, the figure the decode tables' "weights read GB/s" is held against.

    python benchmarks/memory_bandwidth.py [--gib 1] [--threads 1,2] [--repeats 7] [--out results/memory_bandwidth/results.json]

A buffer far past the last-level cache (``--gib``, default 1 GiB of float32) is read (``numpy.sum`` and
``numpy.max``: the bytes read per second) and copied into another (``numpy.copyto``: read + written bytes per second),
by 1 and 2 threads each working on its own contiguous half (numpy releases the GIL in all three). The ceiling is the
faster read: on the 2-core Intel Xeon VM of 2026-12-06 numpy's pairwise sum is bound by its adds (7.9 GB/s a thread,
against max's 16.8, which an AVX-512 load loop in C matched). Medians (and ranges) of ``--repeats``. A decode
step streams its weights, so a reading rate is the ceiling a batch-1 step can reach.
"""
import argparse
import statistics
import sys
import threading
import time

import numpy as np

from jaxserve.bench.throughput import write_results


def timed(work, parts: list[tuple], threads: int) -> float:
    """Seconds for ``threads`` threads to run ``work`` over their parts."""
    pool = [threading.Thread(target=work, args=p) for p in parts[:threads]]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out")
    a = ap.parse_args()
    n = int(a.gib * 2**30) // 4
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
    rows = []
    for threads in map(int, a.threads.split(",")):
        bounds = np.linspace(0, n, threads + 1).astype(int)
        halves = [(src[lo:hi], dst[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
        for op, work, bytes_moved in (("read (sum)", lambda s, d: s.sum(), src.nbytes),
                                      ("read (max)", lambda s, d: s.max(), src.nbytes),
                                      ("copy (read + write)", lambda s, d: np.copyto(d, s), 2 * src.nbytes)):
            timed(work, halves, threads)  # warm: pages touched, threads started once
            rates = [bytes_moved / timed(work, halves, threads) / 1e9 for _ in range(a.repeats)]
            rows.append(dict(op=op, threads=threads, gb_s=statistics.median(rates), gb_s_min=min(rates),
                             gb_s_max=max(rates)))
            print(f"{op:20s} {threads} thread(s): {rows[-1]['gb_s']:.1f} GB/s [{min(rates):.1f}-{max(rates):.1f}]")
    if a.out:
        write_results(a.out, "benchmarks/memory_bandwidth.py", sys.argv[1:], {"bandwidth": rows})


if __name__ == "__main__":
    main()
