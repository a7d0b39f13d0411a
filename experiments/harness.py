"""The shared experiment harness: one command per experiment, one results folder per run.

    python -m experiments.<name> [preset=smoke] [out_dir=PATH] [key.sub=value ...]

An experiment is a package ``experiments/<name>/`` with three files:

- ``config.py``: ``CONFIG``, the default configuration (a frozen dataclass instance, every field
  commented), and ``SMOKE``, a tuple of override strings (same syntax as the command line) that
  make the run finish in well under a minute on a 2-core CPU; ``preset=smoke`` applies them.
- ``run.py``: ``run(cfg, out: ResultsWriter) -> None`` does the science and reports it through
  ``out`` (below); it does not parse arguments or open files itself.
- ``__main__.py``: ``from experiments.harness import main; main("<name>")`` (set environment such
  as ``XLA_FLAGS`` there, before anything imports jax).

A variant with its own configuration lives beside its experiment as a subpackage with the same three
files, ``experiments/<name>/<variant>/``, named ``<name>.<variant>`` (``python -m experiments.<name>.<variant>``);
it writes ``results/<name>/<variant>/``.

Overrides are dotted ``key=value`` strings type-checked by ``jaxserve.config.apply_overrides``
(OmegaConf): an unknown key or a value of the wrong type is a ``ValueError`` naming it, raised
before anything runs or is written. ``preset=`` and ``out_dir=`` belong to the harness.

A run writes into ``out_dir`` (default ``results/<name>/``; ``results/smoke/<name>/`` under the
smoke preset, which git ignores, so a smoke run never overwrites committed results):

- ``results.json``: ``meta`` (UTC date, machine and CPU, load, python/jax/jaxlib versions and
  backend, git commit, the exact command, preset, wall and process CPU seconds, ``complete``),
  ``config`` (the resolved configuration), ``tables`` (name -> list of row dicts), ``figures``
  (name -> PNG file and caption) and any ``out.json(key, value)``. NaN/inf are stored as null.
- ``<figure>.png``: matplotlib figures (Agg, no display needed).
- ``RESULTS.md``: a header with the command and metadata, then the experiment's text, tables and
  figures in the order it reported them. A ``## Notes`` section already in the file (hand-written
  reading of the numbers) is kept by a re-run; everything above it is regenerated.

Both files are rewritten after every report, so a run cut short keeps what it measured
(``meta.complete`` stays false). ``ResultsWriter`` API:

- ``out.progress(iterable, desc=None, total=None)``: a tqdm bar over units of work (stderr).
- ``out.table(name, rows, columns=None, title=None, fmt=None)``: rows (list of dicts) go to
  ``tables[name]`` and as a markdown table into RESULTS.md; ``columns`` maps key -> header (and
  picks/ordering), ``fmt`` maps key -> a format spec for the value, or a callable taking the
  whole row (for cells built from several fields); the JSON keeps the raw rows.
- ``with out.figure(name, caption, **subplots_kw) as ax:`` draw on ``ax`` (``fig.subplots``).
- ``out.json(key, value)``: any JSON-able value at the top level of results.json.
- ``out.text(markdown)``: a paragraph in RESULTS.md.
"""
import contextlib
import dataclasses
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from jaxserve.config import apply_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
NOTES = "## Notes"  # RESULTS.md from this heading on is hand-written and survives re-runs
HARNESS_KEYS = ("preset", "out_dir")


def main(name: str, argv: Sequence[str] | None = None) -> str:
    """Runs experiment ``name`` with command-line ``argv``; returns the output folder."""
    argv = list(sys.argv[1:] if argv is None else argv)
    conf = importlib.import_module(f"experiments.{name}.config")
    try:
        cfg, preset, out_dir = parse(name, conf, argv)
    except ValueError as e:  # a user's typo: one clear line, no traceback
        raise SystemExit(f"python -m experiments.{name}: {e}") from None
    run = importlib.import_module(f"experiments.{name}.run").run
    out = ResultsWriter(out_dir, title=_title(run), meta=_meta(name, argv, preset), config=cfg)
    t0 = time.perf_counter()
    run(cfg, out)
    out.finish(time.perf_counter() - t0)
    print(f"wrote {out_dir}", file=sys.stderr)
    return out_dir


def parse(name: str, conf, argv: Sequence[str]):
    """(config, preset, out_dir) from the command line; errors name the bad argument."""
    harness = {}
    rest = []
    for item in argv:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"argument {item!r} is not of the form key=value")
        if key in HARNESS_KEYS:
            harness[key] = value
        else:
            rest.append(item)
    preset = harness.get("preset")
    presets = {"smoke": tuple(conf.SMOKE)}
    if preset is not None and preset not in presets:
        raise ValueError(f"unknown preset {preset!r} for experiment {name!r}; known: {sorted(presets)}")
    cfg = apply_overrides(conf.CONFIG, [*presets.get(preset, ()), *rest])
    # a variant beside its experiment (experiments/<name>/<variant>/) writes results/<name>/<variant>/
    default = os.path.join(ROOT, "results", *(["smoke"] if preset == "smoke" else []), *name.split("."))
    return cfg, preset, os.path.abspath(harness.get("out_dir") or default)


class ResultsWriter:
    """Collects an experiment's reports and keeps results.json, RESULTS.md and the PNGs on disk."""

    def __init__(self, out_dir: str, title: str, meta: dict, config: Any):
        self.out_dir, self.title = out_dir, title
        os.makedirs(out_dir, exist_ok=True)
        self._notes = _read_notes(os.path.join(out_dir, "RESULTS.md"))
        _remove_old_figures(out_dir)
        self.results = {"meta": {**meta, "complete": False}, "config": _jsonable(dataclasses.asdict(config)),
                        "tables": {}, "figures": {}}
        self._md: list[str] = []
        self._flush()

    def progress(self, iterable: Iterable, desc: str | None = None, total: int | None = None):
        from tqdm.auto import tqdm
        return tqdm(iterable, desc=desc, total=total, file=sys.stderr, dynamic_ncols=True)

    def json(self, key: str, value: Any) -> None:
        if key in ("meta", "config", "tables", "figures"):
            raise ValueError(f"results.json key {key!r} belongs to the harness")
        self.results[key] = _jsonable(value)
        self._flush()

    def text(self, markdown: str) -> None:
        self._md.append(markdown.strip("\n"))
        self._flush()

    def table(self, name: str, rows: Sequence[Mapping], columns: Mapping[str, str] | Sequence[str] | None = None,
              title: str | None = None, fmt: Mapping[str, str | Callable] | None = None) -> None:
        if name in self.results["tables"]:
            raise ValueError(f"table {name!r} reported twice")
        rows = [dict(r) for r in rows]
        self.results["tables"][name] = _jsonable(rows)
        self._md.append(((f"**{title}**\n\n") if title else "") + markdown_table(rows, columns, fmt))
        self._flush()

    @contextlib.contextmanager
    def figure(self, name: str, caption: str = "", **subplots_kw):
        from matplotlib.figure import Figure  # no pyplot: no backend or global state involved
        if name in self.results["figures"]:
            raise ValueError(f"figure {name!r} reported twice")
        fig = Figure(figsize=subplots_kw.pop("figsize", (6.4, 4.2)), layout="constrained")
        yield fig.subplots(**subplots_kw)
        fig.savefig(os.path.join(self.out_dir, f"{name}.png"), dpi=110)
        self.results["figures"][name] = {"file": f"{name}.png", "caption": caption}
        self._md.append(f"![{name}]({name}.png)" + (f"\n\n*{caption}*" if caption else ""))
        self._flush()

    def finish(self, seconds: float) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads: XLA compiles on several
        self.results["meta"].update(complete=True, seconds=round(seconds, 2),
                                    cpu_seconds=round(usage.ru_utime + usage.ru_stime, 2))
        self._flush()

    def _flush(self) -> None:
        with open(os.path.join(self.out_dir, "results.json"), "w") as f:
            json.dump(self.results, f, indent=1, allow_nan=False)
        m = self.results["meta"]
        header = [f"# {self.title}", "",
                  f"Command: `{m['command']}`  ",
                  f"Date: {m['date']}; git {m['git_commit']}; {m['machine']}, load {m['load_average']}; "
                  f"JAX {m['jax_version']} ({m['backend']})"
                  + (f"; {m['seconds']:.0f} s ({m['cpu_seconds']:.0f} s CPU)" if "seconds" in m else "; incomplete run")
                  + (f"; preset {m['preset']}" if m["preset"] else "") + ".", ""]
        body = "\n\n".join(self._md)
        with open(os.path.join(self.out_dir, "RESULTS.md"), "w") as f:
            f.write("\n".join(header) + "\n" + body + "\n" + ("\n" + self._notes if self._notes else ""))


def markdown_table(rows: Sequence[Mapping], columns=None, fmt=None) -> str:
    """A markdown table of ``rows``; ``columns``: keys or {key: header}; ``fmt``: {key: spec or f(row)}."""
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    headers = dict(columns) if isinstance(columns, Mapping) else {k: k for k in columns}
    fmt = fmt or {}

    def cell(key, row):
        f, value = fmt.get(key), row.get(key)
        if callable(f):
            return f(row)
        if value is None:
            return ""
        if isinstance(value, float) and math.isnan(value):
            return "n/a"
        return format(value, f) if f else str(value)

    lines = ["| " + " | ".join(headers.values()) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(k, r) for k in headers) + " |" for r in rows]
    return "\n".join(lines)


def _title(run: Callable) -> str:
    doc = (sys.modules[run.__module__].__doc__ or run.__module__).strip()
    return doc.splitlines()[0].rstrip(".")


def _meta(name: str, argv: Sequence[str], preset: str | None) -> dict:
    import jax  # late: __main__ may have set XLA_FLAGS; run.py has imported jax by now anyway
    return {"experiment": name,
            "command": " ".join(["python -m", f"experiments.{name}", *map(shlex.quote, argv)]),
            "preset": preset,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": _machine(), "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "python": platform.python_version(), "jax_version": jax.__version__,
            "jaxlib_version": importlib.metadata.version("jaxlib"), "backend": jax.default_backend(),
            "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "git_commit": _git_commit()}


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def _git_commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "jaxserve", "pallas_kernels", "experiments")
    return commit + ("+dirty" if dirty else "")


def _read_notes(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        text = f.read()
    at = text.find("\n" + NOTES)
    return text[at + 1:] if at >= 0 else ""


def _remove_old_figures(out_dir: str) -> None:
    """Drops the PNGs the previous run in out_dir reported, so none survives from a different config."""
    try:
        with open(os.path.join(out_dir, "results.json")) as f:
            old = json.load(f).get("figures", {})
    except (OSError, ValueError, AttributeError):
        return
    for fig in old.values():
        path = os.path.join(out_dir, os.path.basename(fig.get("file", "")))
        if path.endswith(".png") and os.path.exists(path):
            os.remove(path)


def _jsonable(x: Any) -> Any:
    """Plain JSON types: tuples -> lists, numpy scalars/arrays -> Python, NaN/inf -> None."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy / jax arrays and scalars
        return _jsonable(x.tolist())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (bool, int, str)):
        return x
    raise TypeError(f"results value {x!r} of type {type(x).__name__} is not JSON-able")
