"""A dataset plugin that fails mid-run, for tests/integration/test_midrun_errors.py:

- reward `refuses_first` refuses its first scoring call (RewardInputError) while the next call keeps the reward
  worker busy in native torch code: the situation that aborted the process at exit (exit 134);
- reward `hangs` keeps every call busy past a short `rollout.reward_deadline_s` (RewardTimeout);
- reward `nan_from_call` scores each image's mean pixel, and NaN for every image from call
  `$REFUSING_PLUGIN_NAN_FROM` on (1-based; never without it): a model whose every sample is non-finite;
- `$REFUSING_PLUGIN_BAD_ITEM=N`: the shapes items from index N on are "corrupt" (DataError when read).
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

from sanarl.datasets import shapes
from sanarl.errors import DataError
from sanarl.rewards import register
from sanarl.rewards.base import Reward, RewardInputError

BUSY_SECONDS = 2.0
"""How long a busy call keeps the worker thread in torch matmuls."""


def _busy(seconds: float) -> None:
    x, end = torch.randn(256, 256), time.monotonic() + seconds
    while time.monotonic() < end:
        x = torch.tanh(x @ x)


@register("refuses_first")
class RefusesFirst(Reward):
    name = "refuses_first"
    keys = ("score",)
    default_key = "score"
    calls = 0

    def _score(self, images, prompts, metadata):
        RefusesFirst.calls += 1
        if RefusesFirst.calls == 1:
            raise RewardInputError(
                f"reward 'refuses_first' refuses prompt {prompts[0]!r} (the test's bad input)"
            )
        _busy(BUSY_SECONDS)
        return {"score": torch.zeros(len(images))}


@register("hangs")
class Hangs(Reward):
    name = "hangs"
    keys = ("score",)
    default_key = "score"

    def _score(self, images, prompts, metadata):
        _busy(BUSY_SECONDS)
        return {"score": torch.zeros(len(images))}


@register("nan_from_call")
class NanFromCall(Reward):
    name = "nan_from_call"
    keys = ("score",)
    default_key = "score"
    calls = 0

    def _score(self, images, prompts, metadata):
        NanFromCall.calls += 1
        start = int(os.environ.get("REFUSING_PLUGIN_NAN_FROM", "0"))
        if start and NanFromCall.calls >= start:
            return {"score": torch.full((len(images),), float("nan"))}
        return {"score": images.float().mean(dim=(1, 2, 3))}


class CorruptFrom(Dataset):
    """The shapes items, with every item from `bad` on unreadable."""

    def __init__(self, items: Dataset, bad: int) -> None:
        self.items, self.bad = items, bad

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        if index >= self.bad:
            raise DataError(f"item {index} of the test data is corrupt (REFUSING_PLUGIN_BAD_ITEM={self.bad})")
        return self.items[index]


def get_dataset(config):
    items = shapes.get_dataset(config)
    bad = os.environ.get("REFUSING_PLUGIN_BAD_ITEM")
    return CorruptFrom(items, int(bad)) if bad else items
