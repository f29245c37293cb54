"""`sanarl-reward --config rewards` where the `service` extra is not installed (the wheel alone): exit 2 with one
line naming `pip install "sanarl[service]"`, not a ModuleNotFoundError traceback. The missing packages are hidden
by a sitecustomize on PYTHONPATH (as tests/integration/test_preflight_cli.py hides wandb)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HIDE = '''
import importlib.abc
import importlib.machinery
import sys

HIDDEN = {HIDDEN!r}


class Hide(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Importing a hidden package fails as it does where it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {{spec.name!r}}", name=spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Hide())
'''


@pytest.mark.parametrize("hidden", [("uvicorn",), ("uvicorn", "fastapi", "redis")], ids=["uvicorn", "all"])
def test_the_reward_service_without_its_extra_names_the_install(hidden, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(HIDE.format(HIDDEN=set(hidden)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(ROOT)]), "HF_HUB_OFFLINE": "1"}
    program = shutil.which("sanarl-reward")
    assert program, "the sanarl-reward entry point is not installed"
    done = subprocess.run(
        [program, "--config", "rewards"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sanarl-reward: error: "), done.stderr
    assert 'pip install "sanarl[service]"' in lines[0]
    assert all(name in lines[0] for name in hidden) and "Traceback" not in done.stderr
