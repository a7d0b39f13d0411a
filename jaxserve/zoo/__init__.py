"""The bundled model zoo: small models trained by ``jaxserve.train`` on the pycode corpus.

Each ``jaxserve/zoo/<name>/`` is a jaxserve checkpoint (``jaxserve_config.json`` + ``params/``) with
``tokenizer.json``, ``MODEL_CARD.md`` (figures written by ``scripts/eval_zoo.py``), the training
curve and metrics, and ``jaxserve_manifest.json`` (sha256 of the files loading reads, checked on
every load; rewrite it with ``scripts/write_zoo_manifests.py`` after changing any of them). Names may
be given bare (``tiny-code``) or prefixed (``jaxserve/tiny-code``).
"""
from __future__ import annotations

import pathlib

ZOO_DIR = pathlib.Path(__file__).resolve().parent
PREFIX = "jaxserve/"


def available_models() -> list[str]:
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "jaxserve_config.json").is_file())


def is_zoo_name(name: str) -> bool:
    return name.removeprefix(PREFIX) in available_models()


def zoo_path(name: str) -> pathlib.Path:
    """Directory of zoo model ``name``; ValueError listing the available names for an unknown one."""
    bare = name.removeprefix(PREFIX)
    if bare not in available_models():
        raise ValueError(f"unknown zoo model {name!r}; available: {available_models()}")
    return ZOO_DIR / bare
