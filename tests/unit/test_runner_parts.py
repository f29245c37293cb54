"""The runner composes parts and names no component (docs/architecture.md, "Run components"): the loop and the
parts it composes (the trained state, checkpoints, validations) reach a component only through the hooks of
`training/component_hooks.py`. Checked on the source with `ast`: no identifier, attribute or import of those modules
names the reward-hacking guard, and each module's code stays short enough to read at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINING = ROOT / "sanarl" / "training"
LOOP_MODULES = ("runner.py", "train_state.py", "run_folder/run_checkpoints.py", "validation.py")
LONGEST_FUNCTION = 60
"""Lines of the longest function of those modules (docstring included): one screen."""


def names_in_code(source: str) -> set[str]:
    """Every identifier the code uses: names, attributes, imported modules and names, definitions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(alias.name for alias in node.names)
            found.add(getattr(node, "module", None) or "")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg)):
            found.add(getattr(node, "name", None) or getattr(node, "arg", ""))
    return found


def naming(source: str, word: str) -> list[str]:
    return sorted(name for name in names_in_code(source) if word in name.lower())


def test_the_checker_finds_a_component_named_in_code_and_ignores_prose() -> None:
    source = (
        '"""Docs may speak of the guard."""\n'
        "from sanarl.training.guard_run import GuardComponent\n"
        "def f(run):\n"
        "    return run.guard.decide()\n"
    )
    assert naming(source, "guard") == ["GuardComponent", "guard", "sanarl.training.guard_run"]
    assert naming('"""the guard"""\nx = 1\n', "guard") == []


@pytest.mark.parametrize("module", LOOP_MODULES)
def test_the_loop_and_its_parts_name_no_component(module: str) -> None:
    assert naming((TRAINING / module).read_text(encoding="utf-8"), "guard") == []


@pytest.mark.parametrize("module", LOOP_MODULES)
def test_each_function_of_the_loop_reads_in_one_screen(module: str) -> None:
    tree = ast.parse((TRAINING / module).read_text(encoding="utf-8"))
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert not long, f"{module}: {long}"
