"""The CLI under `accelerate launch`, as users type it: two CPU processes (gloo) must run ONE training of world
size 2 (the plan printed once for 2 ranks, each step logged once, a checkpoint that records the launch, no DDP
gradient-layout warning), for a `--multi_gpu` launch and for the FSDP2 config file. A process-wide accelerate state made without `cpu=True`
used to make each process train alone into the same folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("accelerate")]  # one launcher at a time: port 29500

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch_cli  # noqa: E402

STEPS = 3
LAUNCHES = {
    "MULTI_CPU": ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    + ["--dynamo_backend", "no"],
    "FSDP": ["--config_file", str(ROOT / "sanarl" / "data" / "accelerate" / "fsdp_cpu.yaml")],
}


@pytest.mark.parametrize("distributed_type", sorted(LAUNCHES))
def test_cli_under_accelerate_runs_one_training_of_world_size_two(distributed_type, tmp_path):
    run = tmp_path / "run"
    cli = ["--config", "tiny-shapes-sft", "sanarl.datasets.shapes"]
    for override in (
        f"train.max_num_steps={STEPS}",
        f"train.output_dir={run}",
        "train.train_batch_per_replica=8",
        "train.train_policy.mini_batch=4",
        f"train.ckpt.save_freq={STEPS}",
        "validation.enable=false",
        "validation.val_before_train=false",
    ):
        cli += ["--set", override]
    done = accelerate_launch_cli(LAUNCHES[distributed_type], cli, tmp_path, OMP_NUM_THREADS="1")

    assert done.stdout.count("sanarl plan") == 1, done.stdout
    assert "2 rank(s) = 4 per rank" in done.stdout, done.stdout
    assert done.stdout.count("done: ") == 1, done.stdout
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    meta = json.loads((run / "checkpoints" / f"step_{STEPS:08d}" / "meta.json").read_text())
    assert (meta["world_size"], meta["distributed_type"]) == (2, distributed_type)
    # DDP finds every gradient in its bucket's layout (SANA's feed-forward convolutions used to warn)
    assert "Grad strides do not match bucket view strides" not in done.stderr, done.stderr[-3000:]


README_LAUNCH = ["--multi_gpu", "--num_processes", "2"]
"""README.md's multi-process line, as typed (accelerate's defaults for everything else)."""
DEFAULT = ["--config", "tiny-shapes-sft", "sanarl.datasets.shapes"]


def test_readme_launch_of_the_cpu_default_runs_as_typed(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 -m sanarl --config tiny-shapes-sft sanarl.datasets.shapes`:
    the default's 64 samples per step split into one micro-batch of 32 per rank (2 steps, everything else as
    shipped: validation before and after, checkpoint, export)."""
    done = accelerate_launch_cli(
        README_LAUNCH, [*DEFAULT, "--set", "train.max_num_steps=2"], tmp_path, OMP_NUM_THREADS="1"
    )
    assert "2 rank(s) = 32 per rank" in done.stdout, done.stdout
    assert done.stdout.count("done: 2 steps") == 1, done.stdout
    run = tmp_path / "outputs" / "tiny-shapes-sft"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (run / "export" / "model_index.json").is_file()


def test_a_batch_that_cannot_split_is_reported_once_by_rank_zero_with_exit_two(tmp_path):
    """96 samples over 2 ranks are 48 per rank, not whole micro-batches of 32: every process stops with exit 2
    before training, the message printed once (rank 0); accelerate then reports the failed launch itself."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *README_LAUNCH, "-m", "sanarl", *DEFAULT]
    cmd += ["--set", "train.train_batch_per_replica=96"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert said.count("error: `train.train_batch_per_replica = 96` must split over 2 rank(s)") == 1, said
    assert said.count("error:") == 1 and "needs a multiple of 64" in said
    assert "exitcode  : 2" in done.stderr, (
        done.stderr
    )  # the processes' own exit code, in accelerate's summary
    assert not (tmp_path / "outputs" / "tiny-shapes-sft" / "metrics.jsonl").exists()
