"""The tutorials in notebooks/ run top to bottom in a fresh kernel and are stored without outputs.

Each notebook is executed with nbclient in a fresh ``python3`` kernel (the interpreter running the
tests), whose inline matplotlib backend renders every figure; a cell that raises fails the test
with the cell's traceback.
"""
import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {"paged_attention.ipynb", "speculative_decoding.ipynb", "moe.ipynb", "fp4.ipynb"}
CELL_TIMEOUT_S = 600  # generous: CI's 2 cores are shared; a notebook takes ~10-30 s alone


def test_every_tutorial_is_present():
    assert EXPECTED <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} cell {i} has stored outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, monkeypatch):
    # The kernel runs in NOTEBOOK_DIR; make sure it imports this checkout's jaxserve.
    repo = str(NOTEBOOK_DIR.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()  # raises CellExecutionError (with the cell's source and traceback) if a cell fails
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert ran and all(c.execution_count for c in ran), f"{path.name}: not every code cell ran"
