"""Rewards: one scorer interface, a registry by name, the multi-reward combiner and an asynchronous pool.

    from sanarl.rewards import RewardFunction, RewardPool, build_reward

    fn = RewardFunction(cfg.train.train_policy.remote_reward)   # builds every [[...reward_fns]] entry once
    result = fn(images, prompts, metadata)                      # RewardResult(total [B], per_key, nan_mask [B])

Shipped rewards (weight-free): `jpeg_compressibility`, `jpeg_incompressibility`, `shapes`; `known_rewards()` lists
every registered name. Importing this package imports no reward model code (rewards are registered lazily).
The shipped scorers live in `sanarl.rewards.scorers`; the modules here are the infrastructure (docs/architecture.md).
"""

from sanarl.rewards.base import (
    Reward,
    RewardInputError,
    Uint8Reward,
    check_batch,
    check_images,
    to_uint8_hwc,
)
from sanarl.rewards.combine import RewardFailure, RewardFunction, RewardResult
from sanarl.rewards.pool import RewardFuture, RewardPool, RewardTimeout
from sanarl.rewards.registry import build_reward, known_rewards, register, register_lazy, unregister

__all__ = [
    "Reward",
    "RewardFailure",
    "RewardFunction",
    "RewardFuture",
    "RewardInputError",
    "RewardPool",
    "RewardResult",
    "RewardTimeout",
    "Uint8Reward",
    "build_reward",
    "check_batch",
    "check_images",
    "known_rewards",
    "register",
    "register_lazy",
    "to_uint8_hwc",
    "unregister",
]
