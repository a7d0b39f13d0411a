"""Executes the tutorials in notebooks/ in place, so they are committed with their outputs and plots.

    python scripts/execute_notebooks.py                 # every notebook
    python scripts/execute_notebooks.py notebooks/fp4.ipynb

Each notebook runs top to bottom in a fresh ``python3`` kernel whose working directory is notebooks/
and which imports this checkout's jaxserve, as ``tests/notebooks/test_notebooks.py`` runs them. What
is stored is kept stable across re-runs: no per-cell timing metadata, a stream's chunks merged, the
kernel's Python version left out of the notebook metadata, tqdm's "no ipywidgets" warning dropped,
and this checkout's absolute path replaced by ``<repo>`` in any text output (the test fails on a
stored absolute path).
"""
import os
import pathlib
import sys

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
CELL_TIMEOUT_S = 600


def execute(path: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook at ``path``, executed in a fresh kernel, with machine-specific text removed."""
    nb = nbformat.read(path, as_version=4)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute(env=env)
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if "outputs" in cell:
            cell.outputs = _coalesce([_scrub(o) for o in cell.outputs if not _environment_warning(o)])
    return nb


def _coalesce(outputs: list) -> list:
    """Consecutive chunks of one stream as one output: how a print is chunked depends on timing."""
    merged = []
    for o in outputs:
        if merged and o.output_type == "stream" and merged[-1].output_type == "stream" and merged[-1].name == o.name:
            merged[-1].text += o.text
        else:
            merged.append(o)
    return merged


def _environment_warning(output) -> bool:
    """tqdm's warning that this kernel has no ipywidgets: about the machine, not the tutorial."""
    return output.get("name") == "stderr" and "TqdmWarning" in output.get("text", "")


def _scrub(output):
    """The output with this checkout's path (and the home directory) in its text replaced by placeholders."""
    def clean(text: str) -> str:
        return text.replace(str(REPO), "<repo>").replace(os.path.expanduser("~"), "~")

    if "text" in output:
        output["text"] = clean(output["text"])
    for key in ("text/plain", "text/html", "text/markdown"):
        if key in output.get("data", {}):
            output["data"][key] = clean(output["data"][key])
    if "traceback" in output:
        output["traceback"] = [clean(line) for line in output["traceback"]]
    return output


def main(argv: list[str]) -> None:
    paths = [pathlib.Path(a).resolve() for a in argv] or sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    for path in paths:
        nb = execute(path)
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"executed {path.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
