"""Held-out scoring: build named rewards and score images with every key of every reward.

Shared by `sanarl eval`, the shapes bench (sanarl/evaluation/generation.py generates, then scores here) and the
runner's reward-hacking guard (`validation.held_out_rewards`). Scores are keyed `<reward>/<key>` (every key a
reward returns, e.g. `shapes/strict`, `shapes/partial`, `pickscore/pickscore`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sanarl.errors import ConfigError
from sanarl.rewards.base import Reward
from sanarl.rewards.registry import build_reward, known_rewards


def build_rewards(names: Sequence[str]) -> dict[str, Reward]:
    """Build each named reward once (order kept, duplicates dropped). Unknown name -> ConfigError listing the known."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise ConfigError(
            f"`--rewards` is empty; name at least one reward (comma-separated), e.g. `--rewards shapes`. Known "
            f"rewards: {', '.join(known_rewards())}."
        )
    unknown = [n for n in names if n not in known_rewards()]
    if unknown:
        raise ConfigError(
            f"`--rewards`: {', '.join(map(repr, unknown))} not a known reward. Known rewards: "
            f"{', '.join(known_rewards())}. Fix the name, or register your own with `@sanarl.rewards.register`."
        )
    return {name: build_reward(name) for name in dict.fromkeys(names)}


def score_images(
    images: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    rewards: Mapping[str, Reward],
) -> dict[str, list[float]]:
    """Every key of every reward for images `[B, 3, H, W]` in [0, 1]: `{"<reward>/<key>": [B] floats}`.

    Reward input errors (e.g. geneval rows missing) propagate as `RewardInputError` (a DataError, exit code 2).
    """
    out: dict[str, list[float]] = {}
    for name, reward in rewards.items():
        for key, values in reward.score(images, list(prompts), [dict(m) for m in metadata]).items():
            out[f"{name}/{key}"] = [float(v) for v in values.tolist()]
    return out
