"""The CLI under `accelerate launch`, as users type it: two CPU processes (gloo) must run ONE training of world
size 2 (the plan printed once for 2 ranks, each step logged once, a checkpoint that records the launch), for a
`--multi_gpu` launch and for the FSDP2 config file. A process-wide accelerate state made without `cpu=True`
used to make each process train alone into the same folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

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
