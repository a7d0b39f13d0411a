"""Lazy package faces (PEP 562): a package exports names without importing the modules behind them.

A face names each export's module once::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"LLM": "jaxserve.engine.llm", ...})
    if TYPE_CHECKING:  # the same names, for type checkers and IDEs
        from jaxserve.engine.llm import LLM

so ``import jaxserve.engine.scheduler`` runs ``jaxserve/__init__.py`` without loading JAX, and
``from jaxserve import LLM`` imports ``jaxserve.engine.llm`` (and JAX) only then. The first access
stores the value in the package's namespace; later ones are plain attribute reads.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for package ``package`` exporting ``name -> module`` ``exports``."""
    exports = dict(exports)

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__, sorted(exports)
