"""The tutorials in notebooks/ are committed executed, with their outputs and plots, and still run.

Each notebook is executed with nbclient in a fresh ``python3`` kernel (the interpreter running the
tests, importing this checkout's jaxserve) by ``scripts/execute_notebooks.py``, the script that
also writes the stored outputs; a cell that raises (the notebooks assert what they teach) fails
the test with the cell's traceback. The stored outputs must come from the current cells: the fresh
run's outputs have the same kinds, cell by cell, as the stored ones (numbers may differ between
JAX versions; a new plot or print that was never stored may not).
"""
import importlib.util
import os
import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {"paged_attention.ipynb", "speculative_decoding.ipynb", "moe.ipynb", "fp4.ipynb"}
MAX_NOTEBOOK_BYTES = 400_000  # outputs stay small: a few PNG plots and short prints, no arrays dumped
MACHINE_PATH = re.compile(r"(?<![\w.~<])/(?:work|tmp|root|home|Users|usr|opt)/")


def _executor():
    spec = importlib.util.spec_from_file_location("execute_notebooks", REPO / "scripts" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _output_kinds(nb) -> list[list[str]]:
    """Per code cell, each output's kind: a stream's name, or a display's richest MIME type."""
    def kind(o):
        if o.output_type == "stream":
            return o.name
        data = o.get("data", {})
        return "image/png" if "image/png" in data else o.output_type
    return [[kind(o) for o in c.outputs] for c in nb.cells if c.cell_type == "code"]


def _output_text(nb) -> str:
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            parts += [o.get("text", ""), o.get("data", {}).get("text/plain", ""), *o.get("traceback", [])]
    return "\n".join(parts)


def test_every_tutorial_is_present():
    assert EXPECTED <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_executed(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: not executed top to bottom in one kernel (run scripts/execute_notebooks.py)"
    assert not any(o.output_type == "error" for c in code for o in c.outputs), f"{path.name} has a stored error"
    assert any("image/png" in kinds for kinds in _output_kinds(nb)), f"{path.name} stores no plot"
    assert not any("execution" in c.metadata for c in code), f"{path.name} stores per-cell timestamps"
    text = _output_text(nb)
    assert str(REPO) not in text and not MACHINE_PATH.search(text), \
        f"{path.name} stores an absolute path: {MACHINE_PATH.search(text) or str(REPO)!r}"
    assert os.path.getsize(path) < MAX_NOTEBOOK_BYTES, f"{path.name}: {os.path.getsize(path)} bytes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    stored = nbformat.read(path, as_version=4)
    fresh = _executor().execute(path)  # raises CellExecutionError if a cell (or its assert) fails
    code = [c for c in fresh.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), f"{path.name}: not every code cell ran"
    assert _output_kinds(fresh) == _output_kinds(stored), \
        f"{path.name}: stored outputs are stale; run python scripts/execute_notebooks.py {path.relative_to(REPO)}"
