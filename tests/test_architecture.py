"""The import graph of jaxserve, pallas_kernels, benchmarks and experiments (from the sources, AST):
no import cycles, no imports of another module's private names, and the layering

    benchmarks/   experiments/      entry points: depend on the library, never on each other
          \\          /
    jaxserve/  (cli and bench at the top)  ->  pallas_kernels/   (kernels import no jaxserve)

Every import counts: top-level, inside functions, and under ``if TYPE_CHECKING`` (a lazy package
face names its exports there). A "package" is ``jaxserve.<x>`` (``jaxserve.engine``, or a top-level
module such as ``jaxserve.cli``), ``pallas_kernels.<x>``, ``benchmarks.<script>`` or
``experiments.<name>``. ``python tests/test_architecture.py`` prints the package graph.
"""
from __future__ import annotations

import ast
import collections
import functools
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("jaxserve", "pallas_kernels", "benchmarks", "experiments")
SCRIPT_DIRS = ("benchmarks",)  # run as scripts: a bare `import x` may be x.py beside them

# Edges the engine refactor (issue 26, steps 1-2: the lead's files) removes; delete each entry with its edge.
# test_allow_lists_hold_no_stale_entries fails once an edge below is gone, so the lists only shrink.
ALLOWED_CYCLE_EDGES: set = set()
ALLOWED_PRIVATE_IMPORTS: set = set()


@functools.cache
def module_files() -> dict[str, pathlib.Path]:
    out = {}
    for top in TOP_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if any(p.startswith(".") for p in parts):  # a venv or cache (benchmarks/peers/.envs), not our code
                continue
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _known(name: str) -> str | None:
    """The deepest module of ours that ``name`` names or lies in (``a.b.C`` -> ``a.b``)."""
    mods = module_files()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return ids


@functools.cache
def imports() -> list[tuple[str, str, str | None, bool]]:
    """``(importer, imported module, name or None, type_checking_only)`` for every import of ours."""
    out = []
    for mod, path in module_files().items():
        tree = ast.parse(path.read_text(), str(path))
        guarded = _type_checking_nodes(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                targets = [(f"{base}.{a.name}", None) if _known(f"{base}.{a.name}") == f"{base}.{a.name}"
                           else (base, a.name) for a in node.names]
            else:
                continue
            for name, imported in targets:
                if mod.split(".")[0] in SCRIPT_DIRS and _known(f"{mod.split('.')[0]}.{name}"):
                    name = f"{mod.split('.')[0]}.{name}"
                target = _known(name)
                if target is not None and target != mod:
                    out.append((mod, target, imported, id(node) in guarded))
    return out


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def module_graph(skip: set = frozenset()) -> dict[str, set[str]]:
    graph = collections.defaultdict(set)
    for src, dst, _, _ in imports():
        if (src, dst) not in skip:
            graph[src].add(dst)
    return graph


def package_graph(skip: set = frozenset()) -> dict[str, set[str]]:
    graph = collections.defaultdict(set)
    for src, dsts in module_graph(skip).items():
        graph[package_of(src)] |= {package_of(d) for d in dsts if package_of(d) != package_of(src)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child), on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_graph_sees_every_kind_of_import():
    edges = {(src, dst, tc) for src, dst, _, tc in imports()}
    assert ("jaxserve.engine.scheduler", "jaxserve.cache.block_manager", False) in edges  # top level
    assert ("jaxserve.models.loading", "jaxserve.zoo", False) in edges  # inside a function
    assert ("jaxserve", "jaxserve.engine.llm", True) in edges  # the face, under TYPE_CHECKING
    assert cycles({"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_module_import_cycles():
    assert cycles(module_graph(ALLOWED_CYCLE_EDGES)) == []


def test_no_package_import_cycles():
    assert cycles(package_graph(ALLOWED_CYCLE_EDGES)) == []


def test_no_imports_of_another_modules_private_names():
    found = {(src, dst, name) for src, dst, name, _ in imports()
             if name and name.startswith("_") and not name.startswith("__")}
    assert found - ALLOWED_PRIVATE_IMPORTS == set()


def test_allow_lists_hold_no_stale_entries():
    edges = {(src, dst) for src, dst, _, _ in imports()}
    assert ALLOWED_CYCLE_EDGES - edges == set(), "an allowed edge is gone: delete its entry"
    private = {(src, dst, name) for src, dst, name, _ in imports()}
    assert ALLOWED_PRIVATE_IMPORTS - private == set(), "an allowed private import is gone: delete its entry"


@pytest.mark.parametrize("importer, forbidden", [
    ("jaxserve", ("benchmarks", "experiments")),
    ("pallas_kernels", ("jaxserve", "benchmarks", "experiments")),
    ("benchmarks", ("experiments",)),
    ("experiments", ("benchmarks",)),
])
def test_layering(importer, forbidden):
    bad = sorted({(src, dst) for src, dst, _, _ in imports()
                  if src.split(".")[0] == importer and dst.split(".")[0] in forbidden})
    assert bad == []


def test_the_library_does_not_import_through_its_own_face():
    """``jaxserve/__init__.py`` imports the library (lazily); a library module importing from it would
    close a cycle through the face. Users and entry points import from ``jaxserve``."""
    assert sorted({src for src, dst, _, _ in imports() if dst == "jaxserve" and src.startswith("jaxserve.")}) == []


def _lazy_faces() -> list[str]:
    return [m for m, p in module_files().items() if p.name == "__init__.py" and "lazy_exports" in p.read_text()]


@pytest.mark.parametrize("face", _lazy_faces())
def test_lazy_face_exports_what_it_declares_for_type_checkers(face):
    tree = ast.parse(module_files()[face].read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "lazy_exports")
    exports = ast.literal_eval(call.args[1])
    guarded = {(dst, name) for src, dst, name, tc in imports() if src == face and tc}
    assert guarded == {(module, name) for name, module in exports.items()}
    package = importlib.import_module(face)
    assert sorted(package.__all__) == sorted(exports) and set(exports) <= set(dir(package))
    for name, module in exports.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name)


if __name__ == "__main__":
    graph = package_graph()
    for pkg in sorted(graph):
        print(f"{pkg} -> {', '.join(sorted(graph[pkg])) or '-'}")
    print("package cycles:", cycles(graph) or "none")
    print("package cycles without the allowed edges:", cycles(package_graph(ALLOWED_CYCLE_EDGES)) or "none")
    print("module cycles:", cycles(module_graph()) or "none")
