"""`[train.train_policy.remote_reward]`, the reward combination every method that scores rewards reads (the
group-RL methods in training, `sanarl eval` and the guard's held-out rewards), and the `[train.train_policy]` keys
that say where it is scored (`RewardKeys`); kept beside the schema that re-exports them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any

from sanarl.config.choices import VideoReduction
from sanarl.config.ranges import AtLeast, Holds, NotBlank

FINITE = Holds(math.isfinite, "finite", "`{key}` = {value!r} must be a finite number (e.g. 1.0).")


@dataclass
class RewardFnConfig:
    """`[[train.train_policy.remote_reward.reward_fns]]`: one reward in the weighted sum."""

    name: Annotated[
        str,
        NotBlank(
            "give each [[train.train_policy.remote_reward.reward_fns]] entry a reward name, e.g. "
            'name = "pickscore"'
        ),
    ] = ""
    """Registered reward name (docs/rewards.md lists them), e.g. "pickscore"."""
    weight: Annotated[float, FINITE] = 1.0
    """Weight of this reward in the sum (after its own clip)."""
    score_key: str = ""
    """Key of the reward's output to use ("" = the reward's default key)."""
    clip_min: float | None = None
    """Clamp this reward's score from below before weighting (None = no clamp)."""
    clip_max: float | None = None
    """Clamp this reward's score from above before weighting (None = no clamp)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the reward's constructor (model paths, device, dtype, batch_size, ...), e.g.
    `options = { model = "reward_ckpts/clip", batch_size = 16 }`; checked against the reward's signature."""


@dataclass
class RemoteRewardConfig:
    """`[train.train_policy.remote_reward]`: the reward combination (in-process or through the service)."""

    reward_fns: list[RewardFnConfig] = field(default_factory=list)
    """The rewards summed into the trained reward (`[[...reward_fns]]` entries)."""
    scale: Annotated[float, FINITE] = 1.0
    """Multiplier of the clamped weighted sum: reward = clamp(sum w_i clamp(r_i)) x scale."""
    reward_clip_min: float | None = None
    """Clamp the weighted sum from below before `scale` (None = no clamp)."""
    reward_clip_max: float | None = None
    """Clamp the weighted sum from above before `scale` (None = no clamp)."""
    video_frame_stride: Annotated[int, AtLeast(1)] = 1
    """Video rewards: score every N-th frame with the image reward."""
    video_frame_reduction: VideoReduction = "mean"
    """Video rewards: how per-frame scores become one score per clip."""


@dataclass
class RewardKeys:
    """Where the rewards are scored: in-process or by the reward service, and with which scorers."""

    use_remote_reward: bool = False
    """Score through the reward service instead of in-process."""
    remote_reward: RemoteRewardConfig = field(default_factory=RemoteRewardConfig)
