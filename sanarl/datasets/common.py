"""Shared helpers for dataset plugins: image loading to a fixed [H, W] and the default `collate`.

Images go through one path everywhere (training data, validation data, user plugins):

1. decode with PIL, apply the EXIF orientation, flatten transparency onto white, convert to RGB;
2. resize *to cover* the target (the smallest uniform scale with both sides >= target, so the aspect ratio is kept
   and nothing is padded), bicubic;
3. crop [H, W] out of the resized image, centered by default or at a uniformly random offset;
4. return a float32 tensor [3, H, W] with values in [0, 1] (uint8 / 255).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from sanarl.errors import ConfigError, DataError, PluginError

IMAGE_SUFFIXES: frozenset[str] = frozenset({".jpg", ".jpeg", ".png", ".webp"})
"""Image file suffixes the folder plugins pair with prompts (compared lower-cased)."""

STACKED_KEYS: tuple[str, ...] = ("image", "video", "chosen", "rejected")
"""Item keys whose tensors the default `collate` stacks along a new batch dimension (`chosen` and `rejected`: the
images of a pair item, sanarl.datasets.pairs)."""

SIZE_KEY = "policy.diffusers.inference_size"


def check_size(size: Sequence[int], key: str = SIZE_KEY) -> tuple[int, int]:
    """Validate a target size `[H, W]` (two positive ints) and return it as a tuple.

    Raises:
        ConfigError: naming `key` when `size` is not two positive integers.
    """
    ok = len(size) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    if not ok:
        raise ConfigError(
            f"`{key}` must be [H, W], two positive integers (e.g. [1024, 1024]); got {list(size)!r}. "
            f"Fix the value in the preset or pass `--set {key}=[H,W]`."
        )
    return int(size[0]), int(size[1])


def cover_size(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> tuple[int, int]:
    """Size (h', w') of the source resized to cover the destination with its aspect ratio kept.

    scale = max(H / h, W / w); (h', w') = (max(H, round(h * scale)), max(W, round(w * scale))), so the limiting side
    equals the target exactly and the other one is >= its target. E.g. src (8, 16) -> dst (4, 4) gives (4, 8).
    """
    (h, w), (big_h, big_w) = src_hw, dst_hw
    scale = max(big_h / h, big_w / w)
    return max(big_h, round(h * scale)), max(big_w, round(w * scale))


def crop_offset(extra: int, random_crop: bool, generator: torch.Generator | None = None) -> int:
    """Start of a crop along one axis that has `extra` = resized - target pixels to drop.

    Center: floor(extra / 2) (an odd surplus drops one more pixel at the end). Random: uniform in [0, extra].
    """
    if not random_crop or extra == 0:
        return extra // 2
    return int(torch.randint(0, extra + 1, (1,), generator=generator).item())


def to_rgb(img: Image.Image) -> Image.Image:
    """Apply the EXIF orientation, composite any transparency onto white, and convert to RGB."""
    img = ImageOps.exif_transpose(img)
    has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba)
    return img.convert("RGB")


def resize_and_crop(
    img: Image.Image,
    size: tuple[int, int],
    random_crop: bool = False,
    generator: torch.Generator | None = None,
) -> Image.Image:
    """Resize `img` to cover `size` = (H, W) (bicubic, aspect kept) and crop (H, W) out of it (center or random)."""
    big_h, big_w = size
    new_h, new_w = cover_size((img.height, img.width), size)
    if (new_h, new_w) != (img.height, img.width):
        img = img.resize((new_w, new_h), Image.Resampling.BICUBIC)
    top = crop_offset(new_h - big_h, random_crop, generator)
    left = crop_offset(new_w - big_w, random_crop, generator)
    return img.crop((left, top, left + big_w, top + big_h))


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image (W x H) -> float32 tensor [3, H, W] in [0, 1] (uint8 value / 255)."""
    array = np.array(img.convert("RGB"), dtype=np.uint8)  # [H, W, 3], a writable copy
    return torch.from_numpy(array).permute(2, 0, 1).contiguous().float().div_(255.0)


def load_image(
    path: str | Path,
    size: Sequence[int],
    random_crop: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Load an image file as a float32 tensor [3, H, W] in [0, 1], resized to cover `size` = [H, W] and cropped.

    Raises:
        DataError: naming the file when it cannot be decoded (corrupt, truncated, not an image).
    """
    target = check_size(size)
    try:
        with Image.open(path) as img:
            img.load()
            rgb = to_rgb(img)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DataError(
            f"Cannot decode image file {str(path)!r}: {exc}. The file is corrupt, truncated or not an image; "
            "re-export it (JPEG/PNG/WebP) or delete it together with its .json."
        ) from exc
    return pil_to_tensor(resize_and_crop(rgb, target, random_crop, generator))


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Default batch collation for plugin items.

    Tensors under "image" ([3, H, W] each -> [B, 3, H, W]) and "video" are stacked along a new first dimension;
    every other key becomes a list of the B per-item values, in order (e.g. "prompt" -> list[str], "metadata" ->
    list[dict]).

    Raises:
        PluginError: when the items do not share the same keys, or stacked tensors differ in shape.
    """
    if not items:
        raise ValueError("collate() needs at least one item")
    keys = list(items[0])
    for i, item in enumerate(items):
        if set(item) != set(keys):
            raise PluginError(
                f"Dataset items in one batch have different keys: item 0 has {sorted(keys)}, item {i} has "
                f"{sorted(item)}. A plugin's `__getitem__` must return the same keys for every item "
                '(SFT: "prompt", "image"; RL: "prompt", "metadata").'
            )
    return {key: _collate_key(key, [item[key] for item in items]) for key in keys}


def _collate_key(key: str, values: list[Any]) -> Any:
    """Stack the tensors of a `STACKED_KEYS` key; keep any other key as a list."""
    if key not in STACKED_KEYS or not all(isinstance(v, torch.Tensor) for v in values):
        return values
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) > 1:
        raise PluginError(
            f'Dataset items in one batch have "{key}" tensors of different shapes {sorted(shapes)}. Resize every '
            f"item to `{SIZE_KEY}` (e.g. with sanarl.datasets.common.load_image) or pass a custom `collate`."
        )
    return torch.stack(values, dim=0)
