"""The shapes dataset plugin: determinism, splits, SFT vs RL items, size validation, collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sanarl.config.schema import Config
from sanarl.datasets import shapes
from sanarl.errors import DataError
from sanarl.worlds import shapes as W


def _config(
    task: str = "sft", split: str = "train", size: int | None = 64, side: int = 32, seed: int = 7
) -> Config:
    cfg = Config()
    cfg.policy.diffusers.inference_size = [side, side]
    cfg.train.train_policy.type = task
    cfg.train.train_policy.dataset.split = split
    cfg.train.train_policy.dataset.size = size
    cfg.train.seed = seed
    return cfg


def test_sft_items_hold_the_ground_truth_render_of_their_metadata():
    ds = shapes.get_dataset(_config("sft"))
    assert len(ds) == 64
    item = ds[5]
    assert set(item) == {"prompt", "image", "metadata"}
    meta, render_seed = W.sample_item("train", 7, 5)
    assert item["metadata"] == meta and item["prompt"] == meta["prompt"]
    expected = torch.from_numpy(W.render(meta, 32, render_seed).astype(np.float32) / 255.0).permute(2, 0, 1)
    assert item["image"].dtype == torch.float32 and item["image"].shape == (3, 32, 32)
    assert torch.equal(item["image"], expected)
    assert W.judge(item["image"].permute(1, 2, 0).numpy(), item["metadata"]).strict == 1.0


def test_rl_items_are_prompt_and_metadata_only():
    ds = shapes.get_dataset(_config("grpo"))
    item = ds[5]
    assert set(item) == {"prompt", "metadata"}
    assert item == {
        "prompt": W.sample_item("train", 7, 5)[0]["prompt"],
        "metadata": W.sample_item("train", 7, 5)[0],
    }


def test_items_are_a_pure_function_of_seed_split_index():
    a, b = shapes.get_dataset(_config()), shapes.get_dataset(_config())
    forward = [a[i] for i in range(8)]
    backward = [b[i] for i in reversed(range(8))][::-1]  # access order does not matter
    for x, y in zip(forward, backward, strict=True):
        assert (
            x["prompt"] == y["prompt"]
            and x["metadata"] == y["metadata"]
            and torch.equal(x["image"], y["image"])
        )
    assert a[-1]["metadata"] == a[63]["metadata"]
    other = shapes.get_dataset(_config(seed=8))
    assert [other[i]["prompt"] for i in range(8)] != [x["prompt"] for x in forward]
    forward[0]["metadata"]["include"].clear()  # items are fresh copies
    assert a[0]["metadata"]["include"]
    with pytest.raises(IndexError):
        a[64]


def test_train_and_heldout_datasets_are_disjoint():
    train = shapes.get_dataset(_config("grpo", "train", size=400))
    test = shapes.get_dataset(_config("grpo", "heldout", size=400))
    train_prompts, test_prompts = {x["prompt"] for x in train}, {x["prompt"] for x in test}
    assert not train_prompts & test_prompts
    assert all(W.split_of(x["metadata"]) == "train" for x in train)
    assert all(W.split_of(x["metadata"]) == "test" for x in test)
    assert {x["metadata"]["tag"] for x in test} == {
        "two_object",
        "counting",
        "colors",
        "position",
        "color_attr",
    }


def test_default_lengths_and_validation_dataset():
    assert len(shapes.get_dataset(_config(size=None))) == 100_000
    assert len(shapes.get_dataset(_config(split="test", size=None))) == 1_024
    cfg = _config("sft")
    cfg.validation.num_samples = 12
    val = shapes.get_val_dataset(cfg)
    assert len(val) == 12 and set(val[0]) == {"prompt", "metadata"}
    assert [val[i]["metadata"] for i in range(12)] == [W.sample_item("test", 7, i)[0] for i in range(12)]


@pytest.mark.parametrize("side", [64, 48])
def test_other_multiples_of_16_render_at_that_size(side):
    assert shapes.get_dataset(_config(side=side))[0]["image"].shape == (3, side, side)


@pytest.mark.parametrize("size", [[32, 64], [24, 24], [40, 40], [16, 16], [32]])
def test_bad_inference_size_is_a_data_error_naming_the_key(size):
    cfg = _config()
    cfg.policy.diffusers.inference_size = size
    with pytest.raises(DataError, match="policy.diffusers.inference_size"):
        shapes.get_dataset(cfg)


def test_bad_split_and_count_are_data_errors_naming_the_key():
    with pytest.raises(DataError, match="train.train_policy.dataset.split"):
        shapes.get_dataset(_config(split="validation"))
    with pytest.raises(DataError, match="train.train_policy.dataset.size"):
        shapes.get_dataset(_config(size=0))
    cfg = _config()
    cfg.validation.dataset.split = "dev"
    with pytest.raises(DataError, match="validation.dataset.split"):
        shapes.get_val_dataset(cfg)


def test_collate_stacks_images_and_lists_the_rest():
    ds = shapes.get_dataset(_config())
    items = [ds[i] for i in range(4)]
    batch = shapes.collate(items)
    assert set(batch) == {"prompt", "image", "metadata"}
    assert batch["image"].shape == (4, 3, 32, 32)
    assert torch.equal(batch["image"][2], items[2]["image"])
    assert batch["prompt"] == [x["prompt"] for x in items]
    assert batch["metadata"] == [x["metadata"] for x in items]
    results = W.judge_batch(batch["image"], batch["metadata"])  # the batch feeds the shapes judge directly
    assert [r.strict for r in results] == [1.0] * 4
    rl = shapes.collate([shapes.get_dataset(_config("grpo"))[i] for i in range(3)])
    assert set(rl) == {"prompt", "metadata"} and len(rl["metadata"]) == 3
