"""Host bookkeeping must not import JAX (DESIGN.md): checked on the source, not sys.modules,
so the test stays valid when package ``__init__``s import the device side."""
import ast
import pathlib

import pytest

import jaxserve

ROOT = pathlib.Path(jaxserve.__file__).parent
HOST_MODULES = ["cache/block_manager.py", "cache/prefix_cache.py", "cache/reservation.py",
                "engine/sequence.py", "engine/scheduler.py", "engine/kv_accounting.py"]


@pytest.mark.parametrize("path", HOST_MODULES)
def test_host_module_imports_no_jax(path):
    tree = ast.parse((ROOT / path).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names, "parsed no imports at all"
    bad = [m for m in names if m.split(".")[0] in ("jax", "jaxlib", "flax")]
    assert not bad, f"{path} imports {bad}"
    local = [m for m in names if m.startswith("jaxserve.")]
    assert all(m.replace(".", "/").removeprefix("jaxserve/") + ".py" in HOST_MODULES for m in local), local
