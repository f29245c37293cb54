"""A test-only reward, imported by the service's worker processes through the config's `plugins` list.

`slow_mean`: sleeps `max(metadata[i]["sleep"])` seconds (0 without it), then returns per image
`mean` = the mean of its pixels in [0, 1] (a hand-checkable score) and `pid` = the scoring process id (which
worker did the work).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from sanarl.rewards.base import Reward
from sanarl.rewards.registry import register


@register("slow_mean")
class SlowMean(Reward):
    """Mean pixel value, after an optional sleep taken from the metadata."""

    name = "slow_mean"
    keys = ("mean", "pid")
    default_key = "mean"

    def _score(self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> dict:
        time.sleep(max(float(m.get("sleep", 0.0)) for m in metadata))
        batch = images.shape[0]
        return {"mean": images.double().mean(dim=(1, 2, 3)), "pid": torch.full((batch,), float(os.getpid()))}
