"""Validation grids a newcomer sees early and at a stop: the CPU default validates after steps 50 and 100 before
its first `validation.freq` (250), and a run stopped by SIGINT leaves the grid of its final checkpoint's weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sanarl.config.presets import resolve_preset_path
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import load_config
from sanarl.training.validation import Validation

pytestmark = pytest.mark.slow


def due_steps(cfg, total: int) -> list[int]:
    validation = Validation.__new__(Validation)  # `due` reads the config only
    validation.cfg = cfg
    return [step for step in range(1, total + 1) if validation.due(step, total)]


def test_the_default_validates_at_50_and_100_then_every_250():
    cfg = load_config(resolve_preset_path("tiny-shapes-sft")).config
    assert cfg.validation.early_steps == [50, 100]
    assert due_steps(cfg, 1500) == [50, 100, 250, 500, 750, 1000, 1250]  # 1500: the run's end validates it


def test_early_steps_must_be_steps():
    with pytest.raises(ConfigError, match=r"validation.early_steps.*must list optimizer steps >= 1"):
        load_config(resolve_preset_path("tiny-shapes-sft"), ["validation.early_steps=[0,50]"])
    off = load_config(resolve_preset_path("tiny-shapes-sft"), ["validation.early_steps=[]"]).config
    assert due_steps(off, 600) == [250, 500]
    assert due_steps(off, 250) == []  # step 250 of 250: the run's end validates it


def test_a_sigint_leaves_the_grid_of_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    sets = [f"train.output_dir={run}", "train.max_num_steps=1000", "train.train_batch_per_replica=8",
            "train.train_policy.mini_batch=8", "train.ckpt.save_freq=1000", "train.ckpt.export_safetensors=false",
            "validation.val_before_train=false", "validation.freq=1000", "validation.early_steps=[2]",
            "validation.num_samples=2", "validation.batch_size=2", "policy.diffusers.sample.eval_num_steps=2"]  # fmt: skip
    cmd = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes"]
    cmd += [arg for value in sets for arg in ("--set", value)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    early, deadline = run / "samples" / "step_00000002.png", time.time() + 300
    while not early.exists():  # the early grid of step 2
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1].decode()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err.decode()[-3000:]
    (checkpoint,) = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")]
    grids = sorted(p.name for p in (run / "samples").glob("step_*.png"))
    assert grids == ["step_00000002.png", f"{checkpoint}.png"] and checkpoint > "step_00000002", grids
