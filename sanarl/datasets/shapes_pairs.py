"""Pair plugin of the shapes world for offline Diffusion-DPO (CPU, no download, deterministic; docs/dpo.md).

Usage: `sanarl --config tiny-shapes-dpo sanarl.datasets.shapes_pairs`.

Item i is `{"prompt": str, "chosen": FloatTensor[3, H, W], "rejected": FloatTensor[3, H, W], "metadata": dict}`
(the pair form, sanarl.datasets.pairs): `chosen` is the shapes world's rendering of the prompt (what
`sanarl.datasets.shapes` gives SFT), `rejected` a rendering of the same scene with one thing wrong (`corrupt`): an
object of another shape, of another colour (where the prompt names one), or one object fewer than the prompt counts
(where it asks for two or more). Both are a pure function of (train.seed, split, i); the judge of docs/shapes.md
scores every chosen image strict 1 and every rejected one below 1 (tests/unit/test_pair_plugins.py).

Config keys read: those of `sanarl.datasets.shapes` (`train.train_policy.dataset.split` and `.size`, `train.seed`,
`policy.diffusers.inference_size`; video is not supported); `get_val_dataset` is the shapes world's validation
prompts. With `train.train_policy.type = "grpo"` the items are those of `sanarl.datasets.shapes` (the same prompts,
without images).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.datasets import shapes
from sanarl.datasets.common import collate as _default_collate
from sanarl.errors import ConfigError
from sanarl.worlds import shapes as world

get_val_dataset = shapes.get_val_dataset
CORRUPTIONS: tuple[str, ...] = ("shape", "colour", "count")
"""What a rejected rendering can get wrong (one of those that apply to the prompt, drawn per item)."""


def _options(metadata: dict[str, Any]) -> list[tuple[str, int]]:
    """(corruption, include entry) pairs that apply to `metadata`: any entry's shape, a named colour, and a count of
    two or more (one fewer breaks the judge's `count >= n`; one more would not)."""
    include = metadata["include"]
    out = [("shape", j) for j in range(len(include))]
    out += [("colour", j) for j, e in enumerate(include) if e.get("color")]
    out += [("count", j) for j, e in enumerate(include) if int(e.get("count", 1)) >= 2]
    return out


def corrupt(metadata: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A copy of `metadata` (its prompt kept) whose scene contradicts the prompt in one drawn way (`_options`):
    another shape (one the scene's other entries do not have), another palette colour, or one object fewer."""
    out = copy.deepcopy(metadata)
    options = _options(out)
    kind, j = options[int(rng.integers(len(options)))]
    entry = out["include"][j]
    if kind == "shape":
        taken = {e["class"] for e in out["include"]}
        others = [s for s in world.SHAPES if s not in taken] or [
            s for s in world.SHAPES if s != entry["class"]
        ]
        entry["class"] = others[int(rng.integers(len(others)))]
    elif kind == "colour":
        others = [c for c in world.PALETTE if c != entry["color"]]
        entry["color"] = others[int(rng.integers(len(others)))]
    else:
        entry["count"] = int(entry["count"]) - 1
    return out


def _pixels(metadata: dict[str, Any], side: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(world.render(metadata, side, seed)).permute(2, 0, 1).float().div_(255.0)


class ShapesPairs(Dataset):
    """Pair items of one split of the shapes world; item i depends only on (seed, split, i)."""

    def __init__(self, split: str, length: int, seed: int, image_size: int) -> None:
        self.split = world.canonical_split(split)
        self.length = int(length)
        self.seed = int(seed)
        self.image_size = world.check_image_size(image_size)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for a shapes pair dataset of {self.length} items")
        metadata, render_seed = world.sample_item(self.split, self.seed, index % self.length)
        wrong = corrupt(metadata, np.random.default_rng([render_seed, 1]))
        return {
            "prompt": metadata["prompt"],
            "chosen": _pixels(metadata, self.image_size, render_seed),
            "rejected": _pixels(wrong, self.image_size, render_seed),
            "metadata": metadata,
        }


def get_dataset(config: Config) -> Dataset:
    """The training pairs (see the module docstring); RL prompts for `type = "grpo"`.

    Raises:
        DataError: bad split, item count or image size (naming the key); ConfigError: video.
    """
    if config.policy.diffusers.is_video:
        raise ConfigError(
            "sanarl.datasets.shapes_pairs renders image pairs; `policy.diffusers.is_video` = true asks for clips. "
            "Set it to false, or write a pair plugin of clips (docs/plugins.md)."
        )
    if (
        config.train.train_policy.type != "sft"
    ):  # RL (online DPO among it) reads prompts: those of the same items
        return shapes.get_dataset(config)
    ds = config.train.train_policy.dataset
    split = world.canonical_split(ds.split, shapes.SPLIT_KEY)
    length = shapes._length(ds.size, split, shapes.COUNT_KEY)
    return ShapesPairs(split, length, config.train.seed, shapes.image_side(config))


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch items: "chosen" and "rejected" [B, 3, H, W], "prompt" list[str], "metadata" list[dict]."""
    return _default_collate(items)
