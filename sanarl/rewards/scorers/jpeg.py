"""JPEG (in)compressibility rewards (docs/algorithms.md, "Rewards"; the DDPO / Flow-GRPO toy rewards).

Each image, as uint8 RGB pixels `round(255 x)` (a `Uint8Reward`: the reward service's pixels are scored as
received), is saved by PIL as JPEG at quality 95; `kb` is the file
size in kilobytes (bytes / 1000):
- `jpeg_compressibility = -kb / 500` (higher = smaller file),
- `jpeg_incompressibility = +kb`.
Both also return the raw size under the key `jpeg_kb`. No weights, no metadata.
"""

from __future__ import annotations

import io
from abc import abstractmethod
from typing import Any

import torch
from PIL import Image

from sanarl.rewards.base import Uint8Reward, to_uint8_channels_last

JPEG_QUALITY = 95
"""PIL JPEG quality used by the published rewards."""
COMPRESSIBILITY_DIVISOR = 500.0
"""jpeg_compressibility = -kB / this."""


def jpeg_kilobytes(images: torch.Tensor, quality: int = JPEG_QUALITY) -> torch.Tensor:
    """JPEG file sizes in kB (bytes / 1000), float32 `[B]`, of images `[B, 3, H, W]`: uint8 pixels (any strides),
    or float in [0, 1], quantised by `round(255 x)` first (PIL, RGB)."""
    sizes = []
    for array in to_uint8_channels_last(images).permute(0, 2, 3, 1).cpu().numpy():
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegSizeReward(Uint8Reward):
    """The JPEG size rewards' shared part: the `quality` option, the size in kB (`jpeg_kb`) and the score under
    `default_key`, which each subclass derives from the size (`from_kilobytes`)."""

    def __init__(self, quality: int = JPEG_QUALITY) -> None:
        super().__init__()
        self.quality = int(quality)

    @abstractmethod
    def from_kilobytes(self, kb: torch.Tensor) -> torch.Tensor:
        """The score `[B]` of images whose JPEG files are `kb` kilobytes."""

    def _score_uint8(
        self, pixels: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        kb = jpeg_kilobytes(pixels, self.quality)
        return {self.default_key: self.from_kilobytes(kb), "jpeg_kb": kb}


class JpegCompressibility(JpegSizeReward):
    """`jpeg_compressibility = -(JPEG q95 bytes / 1000) / 500`: rewards small files (flat, simple images)."""

    name = "jpeg_compressibility"
    keys = ("jpeg_compressibility", "jpeg_kb")
    default_key = "jpeg_compressibility"

    def from_kilobytes(self, kb: torch.Tensor) -> torch.Tensor:
        return -kb / COMPRESSIBILITY_DIVISOR


class JpegIncompressibility(JpegSizeReward):
    """`jpeg_incompressibility = + JPEG q95 kB`: rewards large files (detailed, noisy images)."""

    name = "jpeg_incompressibility"
    keys = ("jpeg_incompressibility", "jpeg_kb")
    default_key = "jpeg_incompressibility"

    def from_kilobytes(self, kb: torch.Tensor) -> torch.Tensor:
        return kb.clone()
