"""The ``pycode`` corpus: a fixed snapshot of CPython standard-library source, split by file.

The snapshot is one xz-compressed JSON-lines file (``data/pycode-v1.jsonl.xz``), one record per
source file: ``{"path", "split", "sha256", "text"}``. Selection, order and split are fixed by
``select_files`` and ``split_of`` (documented in ``data/README.md``); ``scripts/build_corpus.py``
rebuilds it. Everything downstream reads the snapshot, never the machine's own ``Lib/``, so results
do not depend on the local Python version.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import pathlib
from typing import Iterator

CORPUS_NAME = "pycode-v1"
DEFAULT_CORPUS = pathlib.Path(__file__).resolve().parents[2] / "data" / f"{CORPUS_NAME}.jsonl.xz"
SPLITS = ("train", "val")
VAL_PERCENT = 5  # files whose path hash falls in the first 5 of 100 buckets are validation
MAX_FILE_BYTES = 150_000  # drops generated blobs such as pydoc_data/topics.py
# Directories left out: tests (near-duplicate boilerplate), vendored/generated code, and site-packages.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "encodings",
                           "pydoc_data", "ensurepip", "__pycache__", "lib2to3", "turtledemo"})
EXCLUDED_PREFIXES = ("config-", "_sysconfigdata")


def split_of(rel_path: str) -> str:
    """'val' or 'train', from a hash of the relative path (stable under adding/removing files)."""
    bucket = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:4], "big") % 100
    return "val" if bucket < VAL_PERCENT else "train"


def select_files(lib_dir: str | pathlib.Path, max_total_bytes: int) -> list[pathlib.Path]:
    """Sorted relative paths of the ``.py`` files of ``lib_dir`` kept in the snapshot.

    Walks in sorted relative-path order and stops adding files once ``max_total_bytes`` is reached.
    """
    lib_dir = pathlib.Path(lib_dir)
    if not lib_dir.is_dir():
        raise FileNotFoundError(f"standard-library directory {lib_dir} does not exist")
    kept, total = [], 0
    for path in sorted(p.relative_to(lib_dir) for p in lib_dir.rglob("*.py")):
        if any(part in EXCLUDED_DIRS or part.startswith(EXCLUDED_PREFIXES) for part in path.parts):
            continue
        size = (lib_dir / path).stat().st_size
        if size == 0 or size > MAX_FILE_BYTES or total + size > max_total_bytes:
            continue
        kept.append(path)
        total += size
    return kept


def write_corpus(lib_dir: str | pathlib.Path, files: list[pathlib.Path], out: str | pathlib.Path) -> list[dict]:
    """Writes the snapshot ``out`` (.jsonl.xz); returns the manifest rows (path, split, bytes, sha256)."""
    lib_dir, manifest = pathlib.Path(lib_dir), []
    with lzma.open(out, "wt", encoding="utf-8", preset=9) as f:
        for rel in files:
            text = (lib_dir / rel).read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
            row = {"path": rel.as_posix(), "split": split_of(rel.as_posix()),
                   "sha256": hashlib.sha256(text.encode()).hexdigest()}
            f.write(json.dumps({**row, "text": text}, ensure_ascii=False) + "\n")
            manifest.append({**row, "bytes": len(text.encode())})
    return manifest


def iter_documents(path: str | pathlib.Path | None = None, split: str = "train") -> Iterator[str]:
    """Yields the source texts of ``split`` in snapshot order; checks each against its sha256."""
    path = pathlib.Path(path or DEFAULT_CORPUS)
    if split not in SPLITS:
        raise ValueError(f"unknown corpus split {split!r}; available: {SPLITS}")
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist (build it with scripts/build_corpus.py)")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["split"] != split:
                continue
            if hashlib.sha256(row["text"].encode()).hexdigest() != row["sha256"]:
                raise ValueError(f"corpus {path}: {row['path']} does not match its sha256")
            yield row["text"]


def load_documents(path: str | pathlib.Path | None = None, split: str = "train") -> list[str]:
    return list(iter_documents(path, split))
