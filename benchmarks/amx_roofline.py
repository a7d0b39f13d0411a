"""The AMX ceilings of this CPU beside the packed GEMM's own loop: builds and runs ``benchmarks/amx_roofline.cc``.

    python benchmarks/amx_roofline.py [--out results/amx_roofline/results.json]

What it reports (the C++ file's header has the details): the tile multiply's peak (tiles resident, and with the
GEMM's loads from L1), the rate tile loads stream 1 GiB at, the packed GEMM's loop at 32 and 64 decode rows on
SmolLM2's gate/up weight streamed from memory, and at 512 prefill rows with and without writing its bf16 output.
Needs a compiler targeting AMX-BF16 (``-march=native`` on a CPU with it) and Linux's permission for the tiles.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from jaxserve.bench.throughput import write_results

SOURCE = pathlib.Path(__file__).with_name("amx_roofline.cc")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / "amx_roofline"
        subprocess.run([os.environ.get("CXX", "g++"), "-O3", "-march=native", "-std=c++17", "-pthread", str(SOURCE),
                        "-o", str(exe)], check=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in rows:
        extra = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("probe", "threads", "value", "unit"))
        print(f"{r['probe']:13s} {r['threads']} thread(s) {extra:28s} {r['value']:9.1f} {r['unit']}")
    if a.out:
        write_results(a.out, "benchmarks/amx_roofline.py", sys.argv[1:], {"probes": rows})


if __name__ == "__main__":
    main()
