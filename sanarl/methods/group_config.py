"""Config checks DiffusionNFT and Flow-GRPO share (no torch: the registry imports these at config load)."""

from __future__ import annotations

from sanarl.config.schema import Config
from sanarl.errors import ConfigError


def check_steps_per_rollout(cfg: Config) -> None:
    """`optimizer_steps_per_rollout` fits the rollout's micro-batches and the checkpoint cadence (ConfigError)."""
    tp, k = cfg.train.train_policy, cfg.train.train_policy.optimizer_steps_per_rollout
    if k < 1:
        raise ConfigError(
            f"train.train_policy.optimizer_steps_per_rollout = {k} must be >= 1 (1 = one update per rollout)."
        )
    chunks = max(1, cfg.train.train_batch_per_replica // max(1, tp.mini_batch))
    if k > chunks:
        raise ConfigError(
            f"train.train_policy.optimizer_steps_per_rollout = {k} exceeds the {chunks} sample chunks of a rollout "
            f"(train_batch_per_replica {cfg.train.train_batch_per_replica} / mini_batch {tp.mini_batch}); lower it "
            "or raise train_batch_per_replica."
        )
    ckpt = cfg.train.ckpt
    if k > 1 and ckpt.enable_checkpoint and ckpt.save_freq % k:
        raise ConfigError(
            f"train.ckpt.save_freq = {ckpt.save_freq} is not a multiple of optimizer_steps_per_rollout = {k}: a "
            "checkpoint inside a rollout cannot resume it exactly. Set save_freq to a multiple of "
            f"{k} (e.g. {k * max(1, round(ckpt.save_freq / k))})."
        )


def rollouts_for(cfg: Config, steps: int) -> int:
    """Rollouts behind `steps` optimizer steps: one per `optimizer_steps_per_rollout`."""
    return -(-steps // cfg.train.train_policy.optimizer_steps_per_rollout)
