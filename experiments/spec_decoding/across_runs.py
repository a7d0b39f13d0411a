"""One speculative-decoding sweep repeated in several processes: each point's speedup across the runs.

On the shared 2-core CPU VM one configuration's end-to-end speedup moved by up to ±7% between processes
started two minutes apart, and a run's best γ is the largest of several such noisy figures, so one run
can neither show nor rule out a goal near the noise. Run the same command into ``<folder>/run1``,
``run2``, ... and this tabulates, per (path, method, temperature, batch, γ), the median and range over
the runs of the end-to-end and decode-phase speedups, and the same for each run's best γ.

    python -m experiments.spec_decoding.across_runs results/spec_decoding/batch1_greedy_processes_interleaved/vocab1024

prints the table and writes it to ``<folder>/ACROSS_RUNS.md``.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys

_KEY = ("path", "method", "temperature", "batch", "gamma")


def load_runs(folder: str | pathlib.Path) -> list[list[dict]]:
    """Each run's rows (every table but ``best``) from ``folder/*/results.json``, in folder-name order."""
    folder = pathlib.Path(folder)
    files = sorted(folder.glob("*/results.json"), key=lambda p: (len(p.parent.name), p.parent.name))
    if not files:
        raise ValueError(f"no */results.json under {str(folder)!r}: run the experiment with out_dir=<folder>/run1, ...")
    runs = []
    for f in files:
        tables = json.loads(f.read_text())["tables"]
        runs.append([row for name, rows in tables.items() if name != "best" for row in rows])
    return runs


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def summarize(runs: list[list[dict]]) -> list[dict]:
    """Per point (``_KEY``; γ "best" for each run's best γ by end-to-end speedup): the median, min and max
    over the runs of ``speedup`` and ``decode_speedup``, and the γ each run picked as best."""
    points: dict[tuple, list[dict]] = {}
    for rows in runs:
        best: dict[tuple, dict] = {}
        for r in rows:
            points.setdefault(tuple(r[k] for k in _KEY), []).append(r)
            group = tuple(r[k] for k in _KEY[:-1])
            if group not in best or r["speedup"] > best[group]["speedup"]:
                best[group] = r
        for group, r in best.items():
            points.setdefault((*group, "best"), []).append(r)
    out = []
    for key in sorted(points, key=lambda k: (*k[:-1], k[-1] == "best", str(k[-1]).zfill(4))):
        rs = points[key]
        out.append({**dict(zip(_KEY, key)), "speedup": _stats([r["speedup"] for r in rs]),
                    "decode_speedup": _stats([r["decode_speedup"] for r in rs]),
                    "best_gammas": [r["gamma"] for r in rs] if key[-1] == "best" else None})
    return out


def markdown(summary: list[dict]) -> str:
    def cell(s):
        return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"
    lines = ["| path | method | T | batch | γ | runs | speedup: median (range) | decode speedup: median (range) |",
             "|---|---|---|---|---|---|---|---|"]
    for p in summary:
        gamma = p["gamma"] if p["best_gammas"] is None else "best: " + ", ".join(map(str, p["best_gammas"]))
        lines.append(f"| {p['path']} | {p['method']} | {p['temperature']:g} | {p['batch']} | {gamma} | "
                     f"{p['speedup']['runs']} | {cell(p['speedup'])} | {cell(p['decode_speedup'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(f"usage: python -m experiments.spec_decoding.across_runs FOLDER (got {argv})")
    text = markdown(summarize(load_runs(argv[0])))
    (pathlib.Path(argv[0]) / "ACROSS_RUNS.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
