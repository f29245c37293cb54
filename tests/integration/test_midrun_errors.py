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
        3,
        "the rewards failed at step 1: reward scoring call #0 (hangs) ran longer than the deadline of 0.3 s",
    ),
    # every sample of step 3 non-finite: exit 3 naming the step and the checkpoint to continue from
    "every_sample_non_finite": (
        [_rewards("nan_from_call"), "train.max_num_steps=4", "train.ckpt.save_freq=1"],
        {"REFUSING_PLUGIN_NAN_FROM": "5"},  # 2 prompt groups (calls) a step: steps 1 and 2 score
        3,
        "the rewards failed at step 3: every one of the 8 samples got a non-finite reward",
        "the last checkpoint is step 2",
    ),
    # an OpenAI-compatible judge endpoint that does not answer (port 9: nothing listens)
    "judge_endpoint_unreachable": (
        [
            'train.train_policy.remote_reward.reward_fns=[{name="unified_reward", '
            'options={endpoint_url="http://127.0.0.1:9/v1", timeout_s=5.0}}]'
        ],
        {},
        3,
        "the endpoint http://127.0.0.1:9/v1/chat/completions did not answer",
        "no checkpoint was written yet",
    ),
    "bad_data_met_mid_run": (
        [_rewards("jpeg_compressibility"), "train.max_num_steps=3"],
        {"REFUSING_PLUGIN_BAD_ITEM": "2"},
        2,
        "item 2 of the test data is corrupt",
    ),
}
QUIET = ("validation.enable=false", "validation.val_before_train=false", "logging.multi_modal_log_interval=0")
"""The reward cases score only the steps' rollouts."""


@pytest.mark.parametrize("case", list(CASES))
def test_a_mid_run_error_exits_with_its_code_and_message(case, tmp_path):
    overrides, extra_env, code, *messages = CASES[case]
    if "rewards failed" in messages[0]:
        overrides = [*overrides, *QUIET]
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
    assert all(m in stderr for m in messages), stderr[-3000:]
    assert "terminate called" not in stderr and "Traceback" not in stderr
