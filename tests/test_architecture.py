"""The package's shape: no import cycles, each layer imports only the layers inside it, no huge class.

Imports are read with ``ast``. Two graphs: the module-level imports (what runs at import time) and
every import, those inside functions (lazy imports) included; a cycle in either fails. ``if
TYPE_CHECKING:`` blocks run for type checkers only and count in neither, but a third graph with them
too must have no cycle either (a type-only import is still two modules that cannot be understood
apart). The layer rules read the module-level graph.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("evalstop_trl", "platform_sim")

# layer -> the layers (and outside packages) it may import at module level
ALLOWED = {
    "evalstop_trl.core": {"evalstop_trl.core"},
    "evalstop_trl.stores": {"evalstop_trl.core", "evalstop_trl.stores"},
    "evalstop_trl.clients": {"evalstop_trl.core", "evalstop_trl.clients"},
    "evalstop_trl.analysis": {"evalstop_trl.core", "evalstop_trl.analysis"},
    "evalstop_trl.integrations": {"evalstop_trl.core", "evalstop_trl.integrations"},
    "evalstop_trl.service": {"evalstop_trl.core", "evalstop_trl.stores", "evalstop_trl.service",
                             "evalstop_trl.clients.local"},
    # the launcher follows logs with analysis.logs' parsers (one per format); the training of the real-run
    # corpus reads its design from analysis.corpus: analysis imports neither, so no cycle
    "evalstop_trl.launcher": {"evalstop_trl.core", "evalstop_trl.clients", "evalstop_trl.launcher",
                              "evalstop_trl.analysis"},
    "evalstop_trl.train": {"evalstop_trl.core", "evalstop_trl.stores", "evalstop_trl.clients", "evalstop_trl.train",
                           "evalstop_trl.analysis"},
    "platform_sim": {"platform_sim", "evalstop_trl.core", "evalstop_trl.stores"},
}
HEAVY = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        anchor = parts if is_package else parts[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(tree: ast.Module, lazy: bool, typing: bool = False):
    """Import statements at module level (inside module-level ``if``/``try`` too), or, with ``lazy``,
    anywhere (in functions and classes); inside an ``if TYPE_CHECKING:`` block only with ``typing``."""
    def walk(node: ast.AST, depth: int):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                if typing:
                    yield from walk(child, depth + 1)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            elif lazy or isinstance(child, (ast.If, ast.Try, ast.ExceptHandler)) or (
                    hasattr(ast, "TryStar") and isinstance(child, ast.TryStar)):
                yield from walk(child, depth + 1)
    yield from walk(tree, 0)


def _imports_in(source: str, module: str, is_package: bool, lazy: bool = False, typing: bool = False) -> set[str]:
    """Every name ``source`` (the text of ``module``) imports (see :func:`_import_nodes`)."""
    found: set[str] = set()
    for node in _import_nodes(ast.parse(source), lazy, typing):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        else:
            found.update(_resolve(module, is_package, node))
    return found


def _imports(path: Path, lazy: bool = False, typing: bool = False) -> set[str]:
    return _imports_in(path.read_text(), _module_name(path), path.name == "__init__.py", lazy, typing)


def _graph(lazy: bool = False, typing: bool = False) -> dict[str, set[str]]:
    files = _files()
    graph = {}
    for name, path in files.items():
        targets = set()
        for imported in _imports(path, lazy, typing):
            # the longest known module that is a prefix of what was imported
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _raw_imports() -> dict[str, set[str]]:
    return {name: _imports(path) for name, path in _files().items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (``[a, b, ..., a]``), the first a depth-first walk in sorted order meets, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        colour[n] = GREY
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if colour.get(m) == GREY:
                return stack[stack.index(m):] + [m]
            if colour.get(m) == WHITE and (found := visit(m)):
                return found
        stack.pop()
        colour[n] = BLACK
        return None

    for n in sorted(graph):
        if colour[n] == WHITE and (found := visit(n)):
            return found
    return None


def _all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per group of mutually importing modules (strongly connected component): every
    tangle is reported, not only the first. Each cycle starts at its group's first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan (recursive: the graphs here have a few hundred nodes)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for group in groups:
        sub = {n: graph[n] & group for n in group}
        cycles.append(_find_cycle(sub))
    return sorted(cycles)


def _in_package(cycle: list[str], package: str) -> bool:
    return any(m == package or m.startswith(package + ".") for m in cycle)


def test_cycle_finder_finds_a_planted_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    two = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x", "a"}}
    assert _all_cycles(two) == [["a", "b", "a"], ["x", "y", "z", "x"]]
    assert _all_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


PLANTED = """
from __future__ import annotations
from typing import TYPE_CHECKING
from .top import A
try:
    from .guarded import B
except ImportError:
    B = None
if TYPE_CHECKING:
    from .typing_only import C

def f():
    from .lazy import D
    if TYPE_CHECKING:
        from .lazy_typing_only import E
    return D

class K:
    def m(self):
        import pkg.in_method
"""


def test_lazy_imports_are_read_and_type_checking_blocks_are_not():
    eager = _imports_in(PLANTED, "pkg.mod", False)
    every = _imports_in(PLANTED, "pkg.mod", False, lazy=True)
    assert {"pkg.top", "pkg.guarded"} <= eager and not eager & {"pkg.lazy", "pkg.in_method"}
    assert {"pkg.top", "pkg.guarded", "pkg.lazy", "pkg.in_method"} <= every
    assert not {m for m in every if "typing_only" in m}
    typed = _imports_in(PLANTED, "pkg.mod", False, lazy=True, typing=True)
    assert {"pkg.typing_only", "pkg.lazy_typing_only"} <= typed and every <= typed


def test_no_import_cycles():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles_lazy_imports_included(package):
    """A function-level import still ties two modules together: it runs on first call, and the
    modules cannot be understood, tested or moved apart. Shared helpers belong in a module both import."""
    cycles = [c for c in _all_cycles(_graph(lazy=True)) if _in_package(c, package)]
    assert not cycles, (f"{len(cycles)} import cycle(s) in {package}, imports inside functions included:\n"
                        + "\n".join(" -> ".join(c) for c in cycles))


def test_the_package_docstring_and_the_rules_name_every_layer():
    """The layer list of ``evalstop_trl/__init__.py`` and :data:`ALLOWED` are copies of the tree: tied here."""
    import evalstop_trl

    on_disk = {p.name for p in (ROOT / "evalstop_trl").iterdir() if (p / "__init__.py").exists()}
    listed = re.findall(r"^\* ``(\w+)/``", evalstop_trl.__doc__, re.M)
    assert sorted(listed) == sorted(on_disk) and len(listed) == len(set(listed))
    assert {k.removeprefix("evalstop_trl.") for k in ALLOWED if k.startswith("evalstop_trl.")} == on_disk - {"cli"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles_of_any_kind(package):
    """Type-only imports included (the coordinator and its external evals once imported each other
    that way): no cycle of any kind."""
    cycles = [c for c in _all_cycles(_graph(lazy=True, typing=True)) if _in_package(c, package)]
    assert not cycles, (f"{len(cycles)} import cycle(s) in {package}, type-only imports included:\n"
                        + "\n".join(" -> ".join(c) for c in cycles))


def _layer(module: str) -> str | None:
    return next((layer for layer in sorted(ALLOWED, key=len, reverse=True)
                 if module == layer or module.startswith(layer + ".")), None)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_inner_layers(layer):
    bad = []
    for module, targets in _graph().items():
        if _layer(module) != layer:
            continue
        for t in targets:
            if not t.startswith(PACKAGES):
                continue
            if t in ("evalstop_trl",) or not any(t == a or t.startswith(a + ".") for a in ALLOWED[layer]):
                bad.append(f"{module} imports {t}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", ["evalstop_trl.core", "evalstop_trl.stores", "evalstop_trl.clients",
                                   "evalstop_trl.service", "evalstop_trl.analysis", "evalstop_trl.launcher",
                                   "platform_sim"])
def test_only_the_train_layer_imports_the_training_stack(layer):
    bad = [f"{m} imports {i}" for m, imports in _raw_imports().items() if _layer(m) == layer
           for i in imports if i.split(".")[0] in HEAVY]
    assert not bad, "\n".join(bad)


def test_the_core_does_no_io_at_import():
    io = ("fastapi", "uvicorn", "httpx", "sqlite3", "starlette")
    bad = [f"{m} imports {i}" for m, imports in _raw_imports().items() if _layer(m) == "evalstop_trl.core"
           for i in imports if i.split(".")[0] in io]
    assert not bad, "\n".join(bad)


def test_importing_the_package_and_the_simulator_loads_no_training_stack():
    code = ("import sys, evalstop_trl, platform_sim.experiments, evalstop_trl.clients.http;"
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'fastapi') if m in sys.modules];"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
