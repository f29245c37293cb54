"""The message of a run whose rewards failed: what failed, the step, and the checkpoint to continue from.

A `RewardFailure` raised while a step's rollout is scored (every sample non-finite, a reward raising, an unreachable
judge endpoint, the reward service failing a task after its retries), or while a validation scores its samples,
stops the run with `RewardsFailed` (exit code 3, one paragraph, no traceback) instead of an internal error:
nothing of the failed step is trained or saved.
"""

from __future__ import annotations

from pathlib import Path

from sanarl.config.schema import Config
from sanarl.errors import RewardsFailed
from sanarl.rewards.combine import RewardFailure
from sanarl.training.run_folder.checkpoint_store import checkpoint_step, list_checkpoints


def rewards_failed(cfg: Config, ckpt_root: Path, step: int | None, err: RewardFailure) -> RewardsFailed:
    """The one-paragraph stop of a run whose rewards failed while step `step` (1-based) was scored, or (None)
    during a validation."""
    what = str(err).rstrip(".")
    where = (
        f"at step {step}: {what}. Step {step} was not trained and nothing of it was saved"
        if step is not None
        else f"during a validation: {what}"
    )
    return RewardsFailed(f"the rewards failed {where}; {_resume_hint(cfg, ckpt_root)}")


def _resume_hint(cfg: Config, ckpt_root: Path) -> str:
    """Where the run can continue from once the reward is fixed."""
    if not cfg.train.ckpt.enable_checkpoint:
        return "checkpoints are off, so a new run starts from step 0 once the reward works again."
    found = list_checkpoints(ckpt_root)
    if not found:
        return (
            f"no checkpoint was written yet ({ckpt_root}), so the run starts again from step 0 once the reward "
            "works again."
        )
    newest = found[-1]
    return (
        f"the last checkpoint is step {checkpoint_step(newest)} ({newest}): fix the reward (or the reward "
        "service) and continue from it with `--set train.resume=true`."
    )
