"""Each component reads its own config sections (docs/architecture.md, "Config views"): a method's task keeps its
typed view (`sanarl/methods/<method>/config.py`) and the run-level `RunSettings`, never the whole Config; the
rollouts get `[rollout]`, `[policy.diffusers]` and its reward function. Checked on the source with `ast`:
no `self.cfg` / `self.config` attribute is read or set in the methods or in the engine's task-facing modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHOLE_CONFIG_NAMES = ("cfg", "config")
CHECKED = (
    *sorted((ROOT / "sanarl" / "methods").rglob("*.py")),
    ROOT / "sanarl" / "training" / "protocol.py",
)


def whole_config_uses(source: str) -> list[int]:
    """Line numbers of `self.cfg` / `self.config` (read or assigned) in a module's source."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr in WHOLE_CONFIG_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def test_the_checker_finds_a_stored_config_and_ignores_a_view() -> None:
    source = (
        "class T:\n"
        "    def __init__(self, cfg):\n"
        "        self.view = view(cfg)\n"
        "        self.cfg = cfg\n"
        "    def step(self):\n"
        "        return self.view.rollout.n_generation + self.cfg.train.seed\n"
    )
    assert whole_config_uses(source) == [4, 6]
    assert whole_config_uses("def f(cfg):\n    return cfg.train.seed\n") == []


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_methods_and_rollout_keep_no_whole_config(path: Path) -> None:
    lines = whole_config_uses(path.read_text(encoding="utf-8"))
    assert not lines, (
        f"{path.relative_to(ROOT)} keeps the whole Config (self.cfg / self.config at lines {lines}); read the "
        "method's view (`self.view`, its config.py) or the run-level `self.run` (training/protocol.RunSettings)."
    )
