"""The package's shape: no import cycles, and each layer imports only the layers inside it.

Module-level imports are read with ``ast`` (imports inside functions are deliberate lazy imports and
``if TYPE_CHECKING:`` blocks are for type checkers only; neither runs at import time).
"""

from __future__ import annotations

import ast
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
    "evalstop_trl.service": {"evalstop_trl.core", "evalstop_trl.stores", "evalstop_trl.service",
                             "evalstop_trl.clients.local"},
    "evalstop_trl.launcher": {"evalstop_trl.core", "evalstop_trl.launcher"},
    "evalstop_trl.train": {"evalstop_trl.core", "evalstop_trl.stores", "evalstop_trl.clients", "evalstop_trl.train"},
    "platform_sim": {"platform_sim", "evalstop_trl.core", "evalstop_trl.stores"},
}
HEAVY = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        anchor = parts if is_package else parts[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _top_level_imports(path: Path) -> set[str]:
    module = _module_name(path)
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:  # module level only
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in [node, *(ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else ())]:
            if isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom):
                found.update(_resolve(module, path.name == "__init__.py", sub))
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for imported in _top_level_imports(path):
            # the longest known module that is a prefix of what was imported
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _raw_imports() -> dict[str, set[str]]:
    return {_module_name(p): _top_level_imports(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def test_cycle_finder_finds_a_planted_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


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
