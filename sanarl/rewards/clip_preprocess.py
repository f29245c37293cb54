"""CLIP-style image preprocessing on tensors, so gradients can flow to the images (outside `torch.no_grad`).

images `[B, 3, H, W]` in [0, 1] -> resize the shortest side to the processor's `shortest_edge` (bicubic, antialiased,
clamped back to [0, 1]) -> center crop to `crop_size` -> `(x - mean) / std`. It matches the transformers CLIP
processor on PIL images up to the processor's uint8 rounding (exactly when no resize is needed). The CLIP rewards
read the settings from their processor (`ImageTransform.from_processor`); hpsv2 and imagereward build them from
their models' image size and normalisation (`ImageTransform.square`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def _field(obj: Any, key: str) -> Any:
    """`obj[key]` for dicts (transformers 4 sizes), `obj.key` for SizeDict (transformers 5); None if absent."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def resize_shortest_edge(images: torch.Tensor, edge: int) -> torch.Tensor:
    """Resize `[B, 3, H, W]` so that min(H, W) == edge, keeping the aspect ratio like transformers does
    (long side -> int(edge * long / short)); bicubic, antialiased, clamped to [0, 1] (PIL clips too)."""
    height, width = images.shape[-2:]
    if min(height, width) == edge:
        return images
    if height <= width:
        size = (edge, int(edge * width / height))
    else:
        size = (int(edge * height / width), edge)
    out = F.interpolate(images, size=size, mode="bicubic", align_corners=False, antialias=True)
    return out.clamp(0.0, 1.0)


def center_crop(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Center crop `[B, C, H, W]` to `[B, C, height, width]`, offsets `(H - height) // 2` and `(W - width) // 2`;
    a side shorter than the crop is zero-padded symmetrically first (as transformers does)."""
    pad_h, pad_w = max(height - images.shape[-2], 0), max(width - images.shape[-1], 0)
    if pad_h or pad_w:
        images = F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    top = (images.shape[-2] - height) // 2
    left = (images.shape[-1] - width) // 2
    return images[..., top : top + height, left : left + width]


@dataclass(frozen=True)
class ImageTransform:
    """CLIP image preprocessing on tensors: `[B, 3, H, W]` in [0, 1] -> `[B, 3, crop_h, crop_w]` normalised.

    `shortest_edge` None = no resize; `size` (H, W) resizes to exactly that instead (processors without
    `shortest_edge`); `crop` None = no crop.
    """

    shortest_edge: int | None
    size: tuple[int, int] | None
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def square(
        cls, size: int, mean: tuple[float, float, float], std: tuple[float, float, float]
    ) -> ImageTransform:
        """Shortest side to `size`, center crop `size x size`, `(x - mean) / std`: the preprocessing of a model
        that states only its image size and normalisation (hpsv2's open_clip ViT, imagereward's BLIP ViT)."""
        return cls(shortest_edge=size, size=None, crop=(size, size), mean=mean, std=std)

    @classmethod
    def from_processor(cls, processor: Any) -> ImageTransform:
        """Read resize / crop / normalisation settings from a transformers CLIP image processor."""
        size = processor.size if getattr(processor, "do_resize", True) else None
        edge, height, width = (_field(size, k) for k in ("shortest_edge", "height", "width"))
        crop_size = processor.crop_size if getattr(processor, "do_center_crop", True) else None
        crop = (int(_field(crop_size, "height")), int(_field(crop_size, "width"))) if crop_size else None
        normalise = getattr(processor, "do_normalize", True)
        mean = tuple(float(m) for m in processor.image_mean) if normalise else (0.0, 0.0, 0.0)
        std = tuple(float(s) for s in processor.image_std) if normalise else (1.0, 1.0, 1.0)
        return cls(
            shortest_edge=int(edge) if edge else None,
            size=(int(height), int(width)) if not edge and height and width else None,
            crop=crop,
            mean=mean,  # type: ignore[arg-type]
            std=std,  # type: ignore[arg-type]
        )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Preprocess float `[B, 3, H, W]` in [0, 1] (differentiable; computed in float32)."""
        x = images.float()
        if self.shortest_edge is not None:
            x = resize_shortest_edge(x, self.shortest_edge)
        elif self.size is not None and tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bicubic", align_corners=False, antialias=True)
            x = x.clamp(0.0, 1.0)
        if self.crop is not None:
            x = center_crop(x, *self.crop)
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std
