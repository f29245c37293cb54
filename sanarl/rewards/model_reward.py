"""The base of the rewards that hold a model, and the options they share (`device`, `dtype`, `batch_size`).

Each option is parsed once, in the constructor, so a bad value fails before any weight is read, with a message
naming the reward, the option and the values it accepts.
"""

from __future__ import annotations

from typing import Any

import torch

from sanarl.errors import ConfigError
from sanarl.rewards.base import Reward

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
"""Accepted values of the `dtype` option (a torch.dtype works too)."""


def parse_dtype(value: str | torch.dtype, reward: str) -> torch.dtype:
    """The torch dtype named by a reward's `dtype` option; ConfigError naming the choices otherwise."""
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value.lower() in DTYPES:
        return DTYPES[value.lower()]
    raise ConfigError(
        f"reward {reward!r}: option dtype={value!r} is not supported; use one of float32, bfloat16, float16 "
        "(float32 reproduces published scores, bfloat16 halves memory on GPU)."
    )


def parse_batch_size(value: Any, reward: str) -> int:
    """A positive int `batch_size` option; ConfigError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"reward {reward!r}: option batch_size={value!r} must be a positive integer (images per forward "
            "pass; lower it when the reward model runs out of memory)."
        )
    return value


def parse_device(value: str | torch.device, reward: str) -> torch.device:
    """A torch device from a reward's `device` option; ConfigError for a malformed name."""
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"reward {reward!r}: option device={value!r} is not a device ({exc}); use e.g. 'cpu' or 'cuda:0'."
        ) from None


class ModelReward(Reward):
    """Base of the rewards that hold a model: the shared options, parsed once with errors naming the reward.

    Args:
        device: where the model runs (None = the device given to `setup`, CPU by default).
        dtype: float32 | bfloat16 | float16 (scores are returned in float32 either way).
        batch_size: samples per forward pass.
    """

    def __init__(self, device: str | torch.device | None, dtype: str | torch.dtype, batch_size: int) -> None:
        super().__init__()
        self.dtype = parse_dtype(dtype, self.name)
        self.batch_size = parse_batch_size(batch_size, self.name)
        if device is not None:
            self.device = parse_device(device, self.name)
