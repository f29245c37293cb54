"""Dataset plugin for the procedural shapes world (the embedded default dataset: no download, deterministic).

Usage: `sanarl --config tiny-shapes-sft sanarl.datasets.shapes`. The world (palette, shapes, caption
templates, train / held-out split, renderer, judge) lives in `sanarl.worlds.shapes`; docs/shapes.md
specifies it.

Config keys read:
- `train.train_policy.dataset.split`: "train" (default) or "test" / "heldout" (held-out combinations);
- `train.train_policy.dataset.size`: number of items (default 100_000 for train, 1_024 for test);
- `train.seed`: item i is a pure function of (seed, split, i): its prompt, metadata and (SFT) its rendering;
- `policy.diffusers.inference_size`: [H, W], square, a multiple of 16 and >= 32 (32 for the CPU presets);
- `train.train_policy.type`: "sft" -> items `{"prompt": str, "image": FloatTensor[3, H, W] in [0, 1],
  "metadata": dict}`; anything else (RL) -> items `{"prompt": str, "metadata": dict}`;
- `validation.dataset.split` (default "test") and `validation.num_samples` for `get_val_dataset`
  (items `{"prompt", "metadata"}`);
- `policy.diffusers.is_video`: true -> the moving-shapes world of `sanarl.worlds.moving_shapes` (SFT items
  `{"prompt", "video": FloatTensor[3, T, H, W], "metadata"}` with T = `policy.diffusers.train_frames`, a square
  side that is a multiple of 8 and >= 16; docs/video.md).
`dataset.name`, `subset` and `local_dir` are not used. Metadata rows are in GenEval's JSONL format, so the `shapes`
reward (`shapes_world.judge_batch`) and GenEval-style scorers read them directly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.datasets import shapes_video
from sanarl.datasets.common import collate as _default_collate
from sanarl.errors import DataError
from sanarl.worlds import shapes as world

SIZE_KEY = "policy.diffusers.inference_size"
SPLIT_KEY = "train.train_policy.dataset.split"
COUNT_KEY = "train.train_policy.dataset.size"
VAL_SPLIT_KEY = "validation.dataset.split"
VAL_COUNT_KEY = "validation.num_samples"
DEFAULT_SIZES: dict[str, int] = {"train": 100_000, "test": 1_024}
"""Items per split when `dataset.size` is not set."""


class ShapesDataset(Dataset):
    """Items of one split of the shapes world; item i depends only on (seed, split, i).

    Args:
        split: "train" or "test" (aliases accepted by `shapes_world.canonical_split`).
        length: number of items.
        seed: the stream seed (`train.seed`).
        image_size: side of rendered images in px, or None for prompt-only (RL) items.
    """

    def __init__(self, split: str, length: int, seed: int, image_size: int | None = None) -> None:
        self.split = world.canonical_split(split)
        self.length = int(length)
        self.seed = int(seed)
        self.image_size = None if image_size is None else world.check_image_size(image_size)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for a shapes dataset of {self.length} items")
        index = index % self.length
        metadata, render_seed = world.sample_item(self.split, self.seed, index)
        item: dict[str, Any] = {"prompt": metadata["prompt"]}
        if self.image_size is not None:
            pixels = world.render(metadata, self.image_size, render_seed)  # uint8 [H, W, 3]
            item["image"] = torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255.0)
        item["metadata"] = metadata
        return item


def image_side(config: Config) -> int:
    """The square image side from `policy.diffusers.inference_size`.

    Raises:
        DataError: naming `policy.diffusers.inference_size` unless it is [S, S] with S a multiple of 16, >= 32.
    """
    size = list(config.policy.diffusers.inference_size)
    ok = len(size) == 2 and size[0] == size[1]
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 32 and v % 16 == 0 for v in size)
    if not ok:
        raise DataError(
            f"`{SIZE_KEY}` is {size!r}, but sanarl.datasets.shapes renders square images whose side is a multiple "
            f"of 16 and at least 32. Set it to [32, 32] (the CPU default) or [64, 64], e.g. "
            f"`--set {SIZE_KEY}=[32,32]`."
        )
    return int(size[0])


def _length(size: int | None, split: str, key: str) -> int:
    """`size` if set (must be >= 1), else the split's default."""
    if size is None:
        return DEFAULT_SIZES[split]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DataError(
            f"`{key}` is {size!r}; the shapes dataset needs a positive number of items (e.g. 1024)."
        )
    return size


def get_dataset(config: Config) -> Dataset:
    """Training dataset: SFT items with rendered images, or RL items (prompt + metadata) for other task types;
    with `policy.diffusers.is_video` the moving-shapes clips of `sanarl.worlds.moving_shapes`.

    Raises:
        DataError: bad split name, item count or image size (the message names the key).
    """
    ds = config.train.train_policy.dataset
    split = world.canonical_split(ds.split, SPLIT_KEY)
    if config.policy.diffusers.is_video:
        return shapes_video.get_video_dataset(config, _length(ds.size, split, COUNT_KEY))
    side = image_side(config)
    is_sft = config.train.train_policy.type == "sft"
    return ShapesDataset(
        split, _length(ds.size, split, COUNT_KEY), config.train.seed, side if is_sft else None
    )


def get_val_dataset(config: Config) -> Dataset:
    """Validation prompts: `validation.num_samples` items `{"prompt", "metadata"}` of `validation.dataset.split`
    (moving-shapes prompts with `policy.diffusers.is_video`).

    Raises:
        DataError: bad split name or sample count (the message names the key).
    """
    split = world.canonical_split(config.validation.dataset.split or "test", VAL_SPLIT_KEY)
    if config.policy.diffusers.is_video:
        return shapes_video.get_video_val_dataset(
            config, _length(config.validation.num_samples, split, VAL_COUNT_KEY)
        )
    return ShapesDataset(
        split, _length(config.validation.num_samples, split, VAL_COUNT_KEY), config.train.seed
    )


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch items: "image" [B, 3, H, W] (SFT only), "prompt" list[str], "metadata" list[dict]."""
    return _default_collate(items)
