"""An error raised during a run (a reward refusing its input, a reward past its deadline, bad data met mid-run)
ends the `sanarl` process with the error's exit code and message after its threads stop: never an abort
("terminate called without an active exception", exit 134, which a reward worker still inside torch at
interpreter exit caused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "data" / "plugins" / "refusing_reward.py"


def _rewards(name: str) -> str:
    return f'train.train_policy.remote_reward.reward_fns=[{{name="{name}"}}]'


CASES = {
    "reward_refuses_its_input": ([_rewards("refuses_first")], {}, 2, "reward 'refuses_first' refuses prompt"),
    "reward_past_its_deadline": (
        [_rewards("hangs"), "rollout.reward_deadline_s=0.3"],
        {},
        1,
        "ran longer than the deadline of 0.3 s",
    ),
    "bad_data_met_mid_run": (
        [_rewards("jpeg_compressibility"), "train.max_num_steps=3"],
        {"REFUSING_PLUGIN_BAD_ITEM": "2"},
        2,
        "item 2 of the test data is corrupt",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mid_run_error_exits_with_its_code_and_message(case, tmp_path):
    overrides, extra_env, code, message = CASES[case]
    small = [
        "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=16",
        "policy.diffusers.sample.num_steps=4",
    ]
    sets = [arg for o in [*small, *overrides, f"train.output_dir={tmp_path / 'run'}"] for arg in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2", **extra_env}
    done = subprocess.run(
        [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-nft", str(PLUGIN), *sets],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    stderr = " ".join(done.stderr.split())
    assert done.returncode == code, done.stderr[-3000:]
    assert message in stderr and "terminate called" not in stderr
