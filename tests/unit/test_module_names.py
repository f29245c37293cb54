"""A file name names one role (docs/architecture.md, "Shared file names"): two modules of sanarl or the reward
service share a file name only where that section lists the name, and every name it lists is still shared."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def shared_file_names() -> dict[str, list[str]]:
    """File name -> the modules that carry it, for names held by more than one module (`__init__.py` aside)."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in ("sanarl", "reward_service"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py":
                found[path.name].append(str(path.relative_to(ROOT)))
    return {name: paths for name, paths in found.items() if len(paths) > 1}


def documented_shared_names() -> set[str]:
    """The names the bullets of "Shared file names" open with (`- `task.py`, `config.py`: ...`)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Shared file names", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for bullet in re.findall(r"^- (.+?):", section, flags=re.MULTILINE):
        names.update(re.findall(r"`([\w]+\.py)`", bullet))
    return names


def test_only_the_documented_roles_share_a_file_name() -> None:
    shared = shared_file_names()
    undocumented = {name: paths for name, paths in shared.items() if name not in documented_shared_names()}
    assert not undocumented, (
        "modules that share a file name without sharing a role (rename one, or list the role in docs/architecture.md,"
        f' "Shared file names"): {undocumented}'
    )


def test_every_documented_shared_name_is_still_shared() -> None:
    stale = documented_shared_names() - set(shared_file_names())
    assert not stale, (
        f'docs/architecture.md, "Shared file names", lists names no two modules share: {sorted(stale)}'
    )


def test_the_section_is_read() -> None:
    """The parser reads the bullets as written: the names of the first and the last one."""
    names = documented_shared_names()
    assert {"task.py", "config.py", "tiny.py"} <= names
    assert "scoring.py" not in names and "preflight.py" not in names
