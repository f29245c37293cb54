"""`accelerate launch` of a script in tests/data or of the sanarl CLI, for the multi-process tests (CPU over gloo,
or GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent
ROOT = DATA.parents[1]


def accelerate_launch(launch_args: list[str], script: str, out: Path, **env: str) -> Path:
    """Run `accelerate launch <launch_args> tests/data/<script> <out>` offline, with `env` added to the environment;
    fails with the launch's stderr unless every process exits 0. Returns `out`.

    The processes run with Python's faulthandler on, so a crash in native code (a signal, not an exception) leaves
    the Python stack of every thread in stderr; the failure message keeps the start of stderr (where those stacks
    and exceptions are) as well as its end (the launcher's summary)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch_args, str(DATA / script), str(out)]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1", **env}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=environment)
    err = done.stderr
    assert done.returncode == 0, err if len(err) <= 8000 else f"{err[:6000]}\n[...]\n{err[-2000:]}"
    return out


def accelerate_launch_cli(launch_args: list[str], cli_args: list[str], cwd: Path, **env: str):
    """Run `accelerate launch <launch_args> -m sanarl <cli_args>` as a user types it, from `cwd`, offline; fails
    with the launch's output unless every process exits 0. Returns the completed process (stdout, stderr)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch_args, "-m", "sanarl", *cli_args]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1", **env}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=environment, cwd=cwd)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done
