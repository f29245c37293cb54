"""The torch Dataset of the moving-shapes world (sanarl/worlds/moving_shapes.py): the video mode of the
`sanarl.datasets.shapes` plugin."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from sanarl.worlds import shapes as world
from sanarl.worlds.moving_shapes import check_clip_shape, render_clip, sample_item

SIZE_KEY = "policy.diffusers.inference_size"
TRAIN_FRAMES_KEY = "policy.diffusers.train_frames"


class ShapesVideoDataset(Dataset):
    """Items of one split of the moving-shapes world; item i depends only on (seed, split, i).

    Args:
        split: "train" or "test".
        length: number of items.
        seed: the stream seed (`train.seed`).
        clip: (side, frames) of rendered clips, or None for prompt-only (RL) items.

    Items: `{"prompt", "video": FloatTensor[3, T, H, W] in [0, 1] (SFT only), "metadata"}`.
    """

    def __init__(self, split: str, length: int, seed: int, clip: tuple[int, int] | None = None) -> None:
        self.split = world.canonical_split(split)
        self.length, self.seed, self.clip = int(length), int(seed), clip

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for a moving-shapes dataset of {self.length} items")
        metadata, render_seed = sample_item(self.split, self.seed, index % self.length)
        item: dict[str, Any] = {"prompt": metadata["prompt"]}
        if self.clip is not None:
            pixels = render_clip(metadata, self.clip[0], self.clip[1], render_seed)  # uint8 [T, H, W, 3]
            item["video"] = torch.from_numpy(pixels).permute(3, 0, 1, 2).float().div_(255.0)
        item["metadata"] = metadata
        return item


def clip_side(config: Any) -> int:
    """The square clip side from `policy.diffusers.inference_size` (validated)."""
    size = list(config.policy.diffusers.inference_size)
    side = size[0] if len(size) == 2 and size[0] == size[1] else size
    return check_clip_shape(side, 2, SIZE_KEY, TRAIN_FRAMES_KEY)[0]


def get_video_dataset(config: Any, length: int) -> ShapesVideoDataset:
    """Training items of `train.train_policy.dataset.split`: clips of `train_frames` frames for SFT, prompts for
    RL (rollouts use `inference_frames`)."""
    split = world.canonical_split(config.train.train_policy.dataset.split, "train.train_policy.dataset.split")
    diff = config.policy.diffusers
    side = clip_side(config)
    clip = None
    if config.train.train_policy.type == "sft":
        clip = check_clip_shape(side, diff.train_frames, SIZE_KEY, TRAIN_FRAMES_KEY)
    return ShapesVideoDataset(split, length, config.train.seed, clip)


def get_video_val_dataset(config: Any, length: int) -> ShapesVideoDataset:
    """Validation prompts (`{"prompt", "metadata"}`) of `validation.dataset.split` (default "test")."""
    split = world.canonical_split(config.validation.dataset.split or "test", "validation.dataset.split")
    return ShapesVideoDataset(split, length, config.train.seed)
