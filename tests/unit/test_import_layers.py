"""Imports run one way (docs/architecture.md, "Layers"): no cycle between sanarl's subpackages or between its modules,
counting every import statement (function-local ones included), read from the source with `ast`.

`lint-imports` (pyproject.toml `[tool.importlinter]`, run by .ci/run) pins the order of the layers; this test also
covers what a layers contract does not: cycles inside one package (e.g. two modules of sanarl/models/) and modules
that no layer names.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sanarl", "reward_service")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The sanarl / reward_service modules one import statement names (`from pkg import submodule` -> submodule)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: resolve against this module's package
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    return submodules or [target]


def _owner(name: str, known: set[str]) -> str | None:
    """The nearest module of ours that `name` (a dotted import target) lives in, or None for other packages."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports anywhere in its source: function-local and type-only imports (under
    `if TYPE_CHECKING:`) included, since a type-only import ties the two modules together for a reader all the same."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(node, module, path.name == "__init__.py", known):
                owner = _owner(target, known)
                if owner is not None and owner != module:
                    graph[module].add(owner)
    return graph


def subpackage(module: str) -> str:
    """`sanarl.models.tiny` -> `sanarl.models`; top-level modules (sanarl.cli) are their own unit."""
    parts = module.split(".")
    return ".".join(parts[:2])


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto subpackages (an import inside one subpackage is dropped)."""
    units: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        units[subpackage(module)] |= {subpackage(t) for t in targets} - {subpackage(module)}
    return units


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(graph) | {w for ws in graph.values() for w in ws})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph.get(step, ())))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return found


def _evidence(graph: dict[str, set[str]], component: list[str], unit=lambda m: m) -> list[str]:
    members = set(component)
    return sorted(
        f"{a} -> {b}"
        for a, bs in graph.items()
        for b in bs
        if unit(a) in members and unit(b) in members
        if unit(a) != unit(b)
    )


def test_cycle_finder_sees_a_cycle_and_a_function_local_import(tmp_path, monkeypatch) -> None:
    """The checker itself: a cycle held together by a function-local import is found, and one held together by a
    type-only import (`if TYPE_CHECKING:`); a one-way pair is not."""
    pkg = tmp_path / "sanarl"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "b" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from sanarl.b import y\n")
    (pkg / "b" / "y.py").write_text("def f():\n    from sanarl.a import x\n")
    (pkg / "b" / "z.py").write_text("from . import y\n")
    (pkg / "b" / "t.py").write_text("from sanarl.b.u import U\nclass T: ...\n")
    (pkg / "b" / "u.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sanarl.b.t import T\nclass U: ...\n"
    )
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "ROOT", tmp_path)
    monkeypatch.setattr(this, "PACKAGES", ("sanarl",))
    graph = import_graph()
    assert graph["sanarl.b.z"] == {"sanarl.b.y"}
    assert sorted(cycles(graph)) == [["sanarl.a.x", "sanarl.b.y"], ["sanarl.b.t", "sanarl.b.u"]]
    assert cycles(subpackage_graph(graph)) == [["sanarl.a", "sanarl.b"]]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_cycle_between_subpackages(graph) -> None:
    found = cycles(subpackage_graph(graph))
    assert not found, "import cycles between subpackages (docs/architecture.md, 'Layers'):\n" + "\n".join(
        line for component in found for line in _evidence(graph, component, subpackage)
    )


def test_no_cycle_between_modules(graph) -> None:
    found = cycles(graph)
    assert not found, "import cycles between modules:\n" + "\n".join(
        line for component in found for line in _evidence(graph, component)
    )
