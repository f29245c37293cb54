"""The version floors pyproject.toml declares are the ones CI tests: for every requirement of the core and of the
extras CI installs (scripts/install_test_deps.sh), the installed version satisfies it and its floor is the
installed release line (major.minor), so no declared minimum is older than what the suite ran on; no
requirement is listed twice in one list."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TESTED_EXTRAS = ("test", "service", "rewards", "ocr", "geneval", "vlm")
"""The extras scripts/install_test_deps.sh installs (tests/unit/test_ci_command.py holds it to that)."""


def ci_requirements() -> list[Requirement]:
    lists = [PROJECT["dependencies"], *(PROJECT["optional-dependencies"][name] for name in TESTED_EXTRAS)]
    return [Requirement(line) for requirements in lists for line in requirements]


def line(v: Version) -> tuple[int, int]:
    """A version's release line (major, minor): 18 -> (18, 0)."""
    return (*v.release, 0)[:2]


@pytest.mark.parametrize(
    "req", [r for r in ci_requirements() if r.marker is None or r.marker.evaluate()], ids=str
)
def test_each_floor_is_the_tested_release_line(req):
    try:
        installed = Version(version(req.name))
    except PackageNotFoundError:
        pytest.fail(f"{req.name} is declared but not installed: CI installs the core and {TESTED_EXTRAS}")
    assert req.specifier.contains(installed, prereleases=True), f"{req} does not admit the tested {installed}"
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    assert floors, f"{req} declares no floor"
    assert line(max(floors)) == line(installed), (
        f"{req}: the floor is below the tested {installed}; raise it to {installed.major}.{installed.minor}"
    )


@pytest.mark.parametrize("name", ["dependencies", *PROJECT["optional-dependencies"]])
def test_no_requirement_is_listed_twice(name):
    lines = PROJECT["dependencies"] if name == "dependencies" else PROJECT["optional-dependencies"][name]
    names = [Requirement(line).name.lower() for line in lines]
    assert len(names) == len(set(names)), names
