"""The pair form of the plugin contract (sanarl.datasets.pairs) and its two shipped plugins: the shapes world's pairs
(chosen = the prompt's rendering, rejected = one thing wrong, by the judge of docs/shapes.md) and the Pick-a-Pic /
HPD JSONL reader, on a tiny JSONL and images made here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.datasets import preference_jsonl, shapes_pairs
from sanarl.datasets.common import collate
from sanarl.datasets.pairs import check_pair_item
from sanarl.errors import DataError
from sanarl.methods.config_loading import load_config
from sanarl.worlds import shapes as world


def _hwc(image: torch.Tensor) -> np.ndarray:
    return image.permute(1, 2, 0).numpy()


def test_shapes_pairs_chosen_matches_its_prompt_and_rejected_does_not():
    pairs = shapes_pairs.ShapesPairs("train", 60, seed=7, image_size=32)
    corrupted = set()
    for i in range(len(pairs)):
        item = pairs[i]
        check_pair_item(item, "`sanarl.datasets.shapes_pairs`")
        assert world.judge(_hwc(item["chosen"]), item["metadata"]).strict == 1.0, item["prompt"]
        assert world.judge(_hwc(item["rejected"]), item["metadata"]).strict < 1.0, item["prompt"]
        # the chosen image is exactly what sanarl.datasets.shapes renders for SFT
        metadata, seed = world.sample_item("train", 7, i)
        want = torch.from_numpy(world.render(metadata, 32, seed)).permute(2, 0, 1).float() / 255
        assert torch.equal(item["chosen"], want)
        wrong = shapes_pairs.corrupt(metadata, np.random.default_rng([seed, 1]))
        corrupted |= {
            k for a, b in zip(metadata["include"], wrong["include"], strict=True) for k in a if a[k] != b[k]
        }
    assert corrupted == {"class", "color", "count"}  # every kind of mistake occurs
    again = shapes_pairs.ShapesPairs("train", 60, seed=7, image_size=32)[5]
    assert torch.equal(again["rejected"], pairs[5]["rejected"])  # a pure function of (seed, split, index)
    batch = collate([pairs[0], pairs[1]])
    assert batch["chosen"].shape == batch["rejected"].shape == (2, 3, 32, 32)


def _image(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (40, 48)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def _config(jsonl: Path | str, *extra: str):
    return load_config(
        "tiny-shapes-dpo", [f"train.train_policy.dataset.local_dir={jsonl}", "policy.diffusers.inference_size=[32,32]",
                            *extra]
    ).config  # fmt: skip


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def pair_folder(tmp_path) -> Path:
    _image(tmp_path / "img" / "red.png", (255, 0, 0))
    _image(tmp_path / "img" / "blue.jpg", (0, 0, 255))
    return tmp_path


def test_pickapic_and_hpd_lines_give_the_preferred_image_as_chosen_and_skip_ties(pair_folder):
    jsonl = _write(pair_folder / "pairs.jsonl", [
        {"caption": "red", "jpg_0": "img/red.png", "jpg_1": "img/blue.jpg", "label_0": 1},
        {"caption": "blue", "jpg_0": "img/red.png", "jpg_1": str(pair_folder / "img" / "blue.jpg"), "label_0": 0},
        {"caption": "either", "jpg_0": "img/red.png", "jpg_1": "img/blue.jpg", "label_0": 0.5},
        "",
        {"prompt": "blue again", "image_path": ["img/red.png", "img/blue.jpg"], "human_preference": [0, 1]},
    ])  # fmt: skip
    dataset = preference_jsonl.get_dataset(_config(pair_folder))  # the folder's only JSONL
    assert len(dataset) == 3 and dataset.skipped_ties == 1
    red, blue = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0])
    for i, (prompt, chosen) in enumerate([("red", red), ("blue", blue), ("blue again", blue)]):
        item = dataset[i]
        check_pair_item(item, "`sanarl.datasets.preference_jsonl`")
        assert item["prompt"] == prompt and item["chosen"].shape == (3, 32, 32)
        assert torch.allclose(item["chosen"][:, 16, 16], chosen, atol=0.02)
        assert torch.allclose(item["rejected"][:, 16, 16], red + blue - chosen, atol=0.02)
    assert preference_jsonl.get_dataset(_config(jsonl)).pairs == dataset.pairs  # the file itself


@pytest.mark.parametrize(
    ("row", "needles"),
    [
        ({"caption": "x", "jpg_0": "img/red.png", "jpg_1": "img/blue.jpg"}, [":2", "`label_0`", "Pick-a-Pic"]),
        ({"caption": "x", "jpg_0": "img/red.png", "jpg_1": "img/gone.png", "label_0": 1}, [":2", "`jpg_1`", "gone.png", "does not exist"]),
        ({"prompt": "x", "image_path": ["img/red.png"], "human_preference": [1, 0]}, [":2", "`image_path`", "two"]),
        ({"prompt": "x", "image_path": ["img/red.png", "img/blue.jpg"]}, [":2", "`human_preference`", "HPD"]),
        ({"caption": "x", "jpg_0": "img/red.png", "jpg_1": "img/blue.jpg", "label_0": 2}, [":2", "`label_0` = 2"]),
        ("{not json", [":2", "not valid JSON"]),
    ],
)  # fmt: skip
def test_a_bad_line_is_named_by_file_line_and_field(pair_folder, row, needles):
    good = {"caption": "red", "jpg_0": "img/red.png", "jpg_1": "img/blue.jpg", "label_0": 1}
    jsonl = _write(pair_folder / "pairs.jsonl", [good, row])
    with pytest.raises(DataError) as err:
        preference_jsonl.get_dataset(_config(jsonl))
    assert str(jsonl) in str(err.value) and all(n in str(err.value) for n in needles), err.value


def test_an_unset_or_missing_local_dir_is_named_with_the_fix(tmp_path):
    with pytest.raises(DataError, match="local_dir` is empty.*--set"):
        preference_jsonl.get_dataset(_config(""))
    with pytest.raises(DataError, match="does not exist"):
        preference_jsonl.get_dataset(_config(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(
    ("item", "needles"),
    [
        ({"prompt": "a", "image": torch.zeros(3, 4, 4)}, ["keys ['image', 'prompt']", "not preference pairs", "shapes_pairs"]),
        ({"prompt": "a", "chosen": torch.zeros(3, 4, 4)}, ["without a `rejected` image", "__getitem__"]),
        ({"prompt": "a", "chosen": torch.zeros(3, 4, 4), "rejected": torch.zeros(3, 4, 5)}, ["[3, 4, 5]", "one shape"]),
    ],
)  # fmt: skip
def test_check_pair_item_names_what_an_item_lacks(item, needles):
    with pytest.raises(DataError) as err:
        check_pair_item(item, "`my_plugin`")
    assert "`my_plugin`" in str(err.value) and all(n in str(err.value) for n in needles), err.value


def test_shapes_pairs_gives_the_shapes_prompts_to_rl():
    cfg = load_config("tiny-shapes-dpo-online").config
    items = shapes_pairs.get_dataset(cfg)
    assert (
        "chosen" not in items[0]
        and items[0]["prompt"] == shapes_pairs.ShapesPairs("train", 1, 42, 32)[0]["prompt"]
    )
