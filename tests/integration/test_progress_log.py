"""A run whose stdout is a file (nohup, Slurm, `> log`), as a cluster job runs it: the log holds a plain progress
line every `logging.log_freq` steps (step, loss, step time, ETA) and metrics.jsonl stamps each step with the
wall-clock time and the elapsed seconds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime

import pytest

pytestmark = pytest.mark.slow

SHORT = ["train.max_num_steps=4", "logging.log_freq=2", "train.train_batch_per_replica=8",
         "train.train_policy.mini_batch=8", "validation.enable=false", "validation.val_before_train=false",
         "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=false"]  # fmt: skip


def test_a_run_logging_to_a_file_prints_a_line_every_log_freq_steps(tmp_path):
    cmd = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes"]
    cmd += [arg for value in [*SHORT, f"train.output_dir={tmp_path / 'run'}"] for arg in ("--set", value)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("FORCE_COLOR", None)
    log = tmp_path / "log"
    with log.open("w") as stdout:
        done = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"], text
    for line in lines:
        assert re.fullmatch(
            r"step \d/4  loss=\S+  grad_norm=\S+  samples_per_s=\S+  [0-9.e+-]+ s/step  eta \d+:\d\d:\d\d",
            line,
        ), line
    assert lines[-1].endswith("eta 0:00:00")
    assert "\x1b[" not in text  # no terminal escape codes in a file
    assert text.index("sanarl plan") < text.index(lines[0]) < text.index("done: 4 steps")

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert list(records[0])[:3] == ["step", "time", "elapsed_s"]
    times = [datetime.fromisoformat(r["time"].replace("Z", "+00:00")) for r in records]
    assert times == sorted(times) and all(t.tzinfo is not None for t in times)
    elapsed = [r["elapsed_s"] for r in records]
    assert 0 < elapsed[0] < elapsed[1] < elapsed[2] < elapsed[3]
