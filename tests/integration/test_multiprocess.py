"""The same training under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_keep_identical_weights_and_split_the_global_batch(tmp_path):
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        str(ROOT / "tests" / "data" / "ddp_train.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    steps, per_rank = 3, 4
    for step in range(steps):
        a = ranks[0]["reads"][step * per_rank : (step + 1) * per_rank]
        b = ranks[1]["reads"][step * per_rank : (step + 1) * per_rank]
        assert len(a) == len(b) == per_rank and not set(a) & set(b)
    assert (
        len(set(ranks[0]["reads"]) | set(ranks[1]["reads"])) == steps * per_rank * 2
    )  # train_batch_per_replica 8 = 2 ranks x 4
    w0, w1 = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
