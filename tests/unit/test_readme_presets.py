"""The README's table of presets names every shipped preset (a `name-<family>` row stands for Sol-RL's rollout
families of that base)."""

from __future__ import annotations

import re
from pathlib import Path

from sanarl.config.presets import preset_names

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("naive_scaling", "compile", "naive_quant", "sol_rl")


def test_the_readme_lists_every_shipped_preset():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Presets") : readme.index("`sanarl presets` lists")]
    listed = set(re.findall(r"`([\w.\-<>]+)`", table))
    missing = []
    for name in preset_names():
        base, _, family = name.rpartition("-")
        if name not in listed and not (family in FAMILIES and f"{base}-<family>" in listed):
            missing.append(name)
    assert missing == []
