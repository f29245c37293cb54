"""README.md's "Exports load with diffusers" for the CPU default, as typed: its python block runs in the folder of a
(1-step) `sanarl --config tiny-shapes-sft sanarl.datasets.shapes` and draws a 32 px image, and the bare call it
warns about still stops with diffusers' `Invalid sample size`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXPORT = "outputs/tiny-shapes-sft/export"


def readme_block() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    tiny = [block for block in blocks if EXPORT in block]
    assert len(tiny) == 1, blocks
    return tiny[0]


def test_the_readme_call_draws_from_the_tiny_export(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    sets = ["train.max_num_steps=1", "train.train_batch_per_replica=8", "train.train_policy.mini_batch=8",
            "validation.enable=false", "validation.val_before_train=false"]  # fmt: skip
    train = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes"]
    train += [arg for value in sets for arg in ("--set", value)]
    done = subprocess.run(train, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    run = subprocess.run(
        [sys.executable, "-c", readme_block()],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    image = Image.open(tmp_path / "red_circle.png")
    assert image.size == (32, 32) and np.asarray(image).std() > 0  # drawn, not blank

    bare = readme_block().split("pipe(")[0] + 'pipe("a red circle")'
    failed = subprocess.run(
        [sys.executable, "-c", bare], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert failed.returncode != 0 and "Invalid sample size" in failed.stderr
