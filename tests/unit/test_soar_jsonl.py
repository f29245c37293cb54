"""The bucketed JSONL plugin of SOAR: captions, buckets, crops, rank shards, determinism and bad data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from sanarl.config.schema import Config
from sanarl.datasets.soar_jsonl import get_dataset, get_val_dataset, pick_caption
from sanarl.errors import DataError

BUCKETS = {(16, 32): 9, (32, 16): 6, (24, 24): 2}
"""(bh, bw) -> rows: two usable buckets for a global batch of 4, and one that is too small."""


def _image(path: Path, width: int, height: int, split: bool = False) -> None:
    """A solid image, or (split) red on the left half and blue on the right half."""
    img = Image.new("RGB", (width, height), (200, 30, 30))
    if split:
        img.paste((30, 30, 200), (width // 2, 0, width, height))
    img.save(path, quality=95)


def _write(root: Path, rows: list[dict], images: dict[str, tuple[int, int]]) -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    for md5, (w, h) in images.items():
        _image(root / "images" / f"{md5}.jpg", w, h)
    path = root / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _bucketed(root: Path) -> Path:
    rows, images = [], {}
    for (bh, bw), n in BUCKETS.items():
        for i in range(n):
            md5 = f"{bh}x{bw}_{i}"
            rows.append({"md5": md5, "caption_en": f"item {md5}", "bw": bw, "bh": bh})
            images[md5] = (2 * bw + 3, bh + 5)  # not the bucket size: resize to cover, then crop
    return _write(root, rows, images)


def _config(local_dir: str | Path, subset: str = "", seed: int = 7) -> Config:
    cfg = Config()
    cfg.train.seed = seed
    cfg.train.train_policy.dataset.local_dir = str(local_dir)
    cfg.train.train_policy.dataset.subset = subset
    cfg.policy.diffusers.inference_size = [16, 16]
    return cfg


@pytest.fixture
def dataset(tmp_path):
    return get_dataset(_config(_bucketed(tmp_path)))


def test_caption_rule() -> None:
    nested = {"short_caption": "a cat", "medium_caption": "a grey cat", "long_caption": "a grey cat on a mat"}
    assert pick_caption("  a dog ", "f:1") == "a dog"
    assert pick_caption(json.dumps(nested), "f:1") == "a grey cat on a mat"
    assert pick_caption({"caption_short": "s", "caption_medium": "m", "long": ""}, "f:1") == "m"
    assert pick_caption(json.dumps({"caption": "plain"}), "f:1") == "plain"
    assert pick_caption("{not json} braces", "f:1") == "{not json} braces"
    with pytest.raises(DataError, match="f:3: .*no caption"):
        pick_caption("", "f:3")
    with pytest.raises(DataError, match="f:4: .*long / medium / short"):
        pick_caption({"title": "x"}, "f:4")


def test_items_have_their_bucket_size_and_caption(dataset) -> None:
    assert len(dataset) == sum(BUCKETS.values())
    assert {k: len(v) for k, v in dataset.buckets.items()} == BUCKETS
    item = dataset[0]
    assert item["prompt"] == "item 16x32_0"
    assert tuple(item["image"].shape) == (3, 16, 32)
    assert abs(float(item["image"][0].mean()) - 200 / 255) < 0.03  # solid red survives resize + crop + JPEG
    assert dataset.describe_row(0).endswith("train.jsonl:1")


def test_batches_are_bucket_pure_disjoint_across_ranks_and_cover_each_epoch(dataset) -> None:
    world, per_rank = 2, 2
    per_epoch = dataset.num_batches(world * per_rank)
    assert per_epoch == 9 // 4 + 6 // 4  # the 24x24 bucket (2 rows) never fills a batch
    for epoch in range(2):
        seen: list[int] = []
        for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            shards = [dataset.batch_indices(step, r, world, per_rank) for r in range(world)]
            assert all(len(s) == per_rank for s in shards)
            assert not set(shards[0]) & set(shards[1])
            rows = shards[0] + shards[1]
            assert len({(dataset.rows[i].height, dataset.rows[i].width) for i in rows}) == 1
            items = dataset.batch_items(step, 1, world, per_rank)
            assert [it["prompt"] for it in items] == [dataset.rows[i].caption for i in shards[1]]
            assert len({tuple(it["image"].shape) for it in items}) == 1
            seen += rows
        assert len(seen) == len(set(seen)) == 4 * per_epoch  # each row at most once per epoch
        by_bucket = {key: sum(i in seen for i in rows) for key, rows in dataset.buckets.items()}
        assert by_bucket == {(16, 32): 8, (32, 16): 4, (24, 24): 0}


def test_order_and_crops_are_deterministic_by_seed_and_epoch(tmp_path) -> None:
    path = _bucketed(tmp_path)
    a, b = get_dataset(_config(path)), get_dataset(_config(path))
    other = get_dataset(_config(path, seed=8))
    steps = range(2 * a.num_batches(4))
    order = [a.batch_indices(s, 0, 1, 4) for s in steps]
    assert order == [b.batch_indices(s, 0, 1, 4) for s in steps]
    assert order != [other.batch_indices(s, 0, 1, 4) for s in steps]
    per_epoch = a.num_batches(4)
    assert order[:per_epoch] != order[per_epoch:]  # reshuffled each epoch
    assert torch.equal(a.load(3, epoch=5)["image"], b.load(3, epoch=5)["image"])


def test_random_crop_covers_then_crops_a_window_that_moves_with_the_epoch(tmp_path) -> None:
    root = tmp_path / "crop"
    path = _write(root, [{"md5": "x", "caption_en": "c", "bw": 16, "bh": 16}], {})
    _image(root / "images" / "x.jpg", 64, 32, split=True)  # cover 16x16 -> 32 x 16: red cols 0-15, blue 16-31
    ds = get_dataset(_config(path))
    red_columns = set()
    for epoch in range(24):
        img = ds.load(0, epoch)["image"]
        assert tuple(img.shape) == (3, 16, 16)
        red = (img[0].mean(0) > img[2].mean(0)).tolist()
        n = sum(red)
        assert red == [True] * n + [False] * (16 - n)  # one contiguous window: red part, then blue part
        red_columns.add(n)
    assert len(red_columns) >= 4 and min(red_columns) <= 4 and max(red_columns) >= 12


def test_missing_images_are_counted_then_refused(tmp_path, caplog) -> None:
    rows = [{"md5": f"m{i}", "caption_en": "c", "bw": 16, "bh": 16} for i in range(40)]
    path = _write(tmp_path, rows, {f"m{i}": (16, 16) for i in range(1, 40)})
    ds = get_dataset(_config(path))
    assert len(ds) == 39 and ds.skipped["missing_image"] == 1
    assert "skipped 1 of 40 rows" in caplog.text
    for i in range(1, 6):
        (tmp_path / "images" / f"m{i}.jpg").unlink()
    with pytest.raises(DataError, match=r"6 of 40 rows have no image file .*m0, m1, m2"):
        get_dataset(_config(path))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"md5": "a", "caption_en": "c", "bw": 16', "train.jsonl:2: malformed JSON"),
        ('["a"]', "train.jsonl:2: expected a JSON object"),
        ('{"caption_en": "c", "bw": 16, "bh": 16}', "train.jsonl:2: `md5` must be"),
        ('{"md5": "../etc", "caption_en": "c", "bw": 16, "bh": 16}', "train.jsonl:2: `md5` must be"),
        ('{"md5": "a", "caption_en": "c", "bw": 0, "bh": 16}', "train.jsonl:2: `bw` must be a positive"),
        ('{"md5": "a", "caption_en": "c", "bw": 16, "bh": "16"}', "train.jsonl:2: `bh` must be a positive"),
        ('{"md5": "a", "bw": 16, "bh": 16}', "train.jsonl:2: the row has no caption"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, line: str, message: str) -> None:
    path = _write(tmp_path, [{"md5": "a", "caption_en": "c", "bw": 16, "bh": 16}], {"a": (16, 16)})
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(DataError, match=message.replace("[", r"\[")):
        get_dataset(_config(path))


def test_locating_files_and_folders(tmp_path) -> None:
    path = _bucketed(tmp_path / "d")
    assert len(get_dataset(_config(path.parent))) == len(get_dataset(_config(path)))  # dir holding one JSONL
    (path.parent / "images").rename(path.parent / "pics")
    with pytest.raises(DataError, match="default image folder .*subset"):
        get_dataset(_config(path))
    assert len(get_dataset(_config(path, subset="pics"))) == len(path.read_text().splitlines())
    with pytest.raises(DataError, match="`train.train_policy.dataset.local_dir` is empty"):
        get_dataset(_config(""))
    with pytest.raises(DataError, match="does not exist"):
        get_dataset(_config(tmp_path / "nope.jsonl"))
    (path.parent / "more.jsonl").write_text("")
    with pytest.raises(DataError, match="holds 2 JSONL files"):
        get_dataset(_config(path.parent))
    cfg = _config(path, subset="pics")
    assert get_val_dataset(cfg) is None
    cfg.validation.dataset.local_dir = str(path)
    cfg.validation.dataset.subset = "pics"
    assert len(get_val_dataset(cfg)) == len(get_dataset(cfg))


def test_sft_folder_layout_is_one_bucket_of_the_inference_size(tmp_path) -> None:
    for stem in ("a", "b"):
        _image(tmp_path / f"{stem}.png", 40, 20)
        (tmp_path / f"{stem}.json").write_text(json.dumps({"prompt": f"p {stem}"}))
    ds = get_dataset(_config(tmp_path))
    assert list(ds.buckets) == [(16, 16)]
    assert [ds[i]["prompt"] for i in range(2)] == ["p a", "p b"]
    assert tuple(ds[1]["image"].shape) == (3, 16, 16)


def test_batch_larger_than_every_bucket_is_refused(dataset, caplog) -> None:
    dataset.check_batch(4)
    assert "24x24 (2)" in caplog.text  # the bucket that can never fill a batch is named
    with pytest.raises(DataError, match="no \\(bh, bw\\) bucket has `train.train_batch_per_replica` = 10"):
        dataset.check_batch(10)
    with pytest.raises(DataError, match="lower `train.train_batch_per_replica` to at most 9"):
        dataset.batch_indices(0, 0, 1, 10)


def test_undecodable_image_is_replaced_by_the_next_row_of_its_bucket(dataset) -> None:
    first = dataset.buckets[(32, 16)][0]
    dataset.rows[first].image.write_bytes(b"not a jpeg")
    item = dataset.load(first, epoch=0)
    assert item["prompt"] == dataset.rows[dataset.buckets[(32, 16)][1]].caption
    assert tuple(item["image"].shape) == (3, 32, 16) and dataset.skipped["unreadable_at_load"] == 1
