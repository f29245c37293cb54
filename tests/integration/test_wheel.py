"""The built wheel carries every module and the package data (presets, shipped tiny bases, prompt sets, example
data, accelerate and reward-service configs) and stays small. scripts/check_wheel.sh (run by .ci/run) installs it
outside the checkout and runs the CPU default from a temporary directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_WHEEL_BYTES = 12 * 2**20
"""The tiny bases are a few MB of fp16 weights; anything much larger has slipped in by mistake."""


def _package_data() -> list[str]:
    folders = [ROOT / "sanarl" / "presets", ROOT / "sanarl" / "data", ROOT / "reward_service" / "configs"]
    return sorted(
        path.relative_to(ROOT).as_posix()
        for folder in folders
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )


def _source_copy(target: Path) -> Path:
    """What the build reads (an in-tree build would leave build/ and *.egg-info in the checkout)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("sanarl", "reward_service"):
        shutil.copytree(ROOT / name, target / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    return target


def test_the_wheel_holds_every_package_data_file(tmp_path):
    source = _source_copy(tmp_path / "src")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            ".",
            "-w",
            str(tmp_path),
        ],
        check=True,
        cwd=source,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("sanarl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = _package_data()
    assert len(data) > 60 and "sanarl/presets/tiny-shapes-sft.toml" in data
    assert [name for name in data if name not in names] == []
    assert "sanarl/config/presets.py" in names and "reward_service/configs/rewards.toml" in names
    modules = sorted(
        p.relative_to(source).as_posix()
        for name in ("sanarl", "reward_service")
        for p in (source / name).rglob("*.py")
    )
    assert "sanarl/rewards/scorers/vlm/qwen.py" in modules
    # every subpackage is found by pyproject's [tool.setuptools.packages.find]
    assert [name for name in modules if name not in names] == []
    assert wheel.stat().st_size < MAX_WHEEL_BYTES
