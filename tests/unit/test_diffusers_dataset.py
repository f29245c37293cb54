"""Tests of the SFT folder plugin (sanarl.datasets.diffusers_dataset) and the shared helpers (datasets.common)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.config.dataset_plugins import check_plugin, resolve_plugin
from sanarl.config.schema import Config
from sanarl.datasets import common, diffusers_dataset
from sanarl.errors import ConfigError, DataError, PluginError

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def _config(local_dir: Path | str, size: tuple[int, int] = (4, 4), task: str = "sft") -> Config:
    config = Config()
    config.train.train_policy.dataset.local_dir = str(local_dir)
    config.train.train_policy.type = task
    config.policy.diffusers.inference_size = list(size)
    return config


def _image(path: Path, array: np.ndarray) -> Path:
    """Save an [H, W, C] uint8 array as an image (format from the suffix)."""
    Image.fromarray(array).save(path)
    return path


def _solid(path: Path, rgb: tuple[int, int, int], hw: tuple[int, int] = (4, 4)) -> Path:
    return _image(path, np.full((*hw, 3), rgb, dtype=np.uint8))


def _prompt(path: Path, prompt: object) -> Path:
    path.write_text(json.dumps({"prompt": prompt}))
    return path


def _rgb(tensor: torch.Tensor) -> list[tuple[int, int, int]]:
    """Colours of row 0 of a [3, H, W] tensor in [0, 1], as uint8 triples per column."""
    return [tuple(int(round(c * 255)) for c in tensor[:, 0, w].tolist()) for w in range(tensor.shape[2])]


# ---------------------------------------------------------------------------------------------------- pairing


def test_pairs_by_exact_stem_and_warns_about_decoys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _prompt(tmp_path / "a.json", "prompt a")
    _solid(tmp_path / "a.png", RED)
    _solid(tmp_path / "a_1.png", GREEN)  # must not pair with a.json, although it sorts right after a.png
    _prompt(tmp_path / "b.json", "prompt b")  # no image
    _solid(tmp_path / "c.png", BLUE)  # no json
    _prompt(tmp_path / "z.json", "prompt z")
    _solid(tmp_path / "z.PNG", BLUE)  # suffixes are case-insensitive
    (tmp_path / "notes.txt").write_text("ignored")
    with caplog.at_level(logging.WARNING):
        ds = diffusers_dataset.get_dataset(_config(tmp_path))

    assert [s.stem for s in ds.samples] == ["a", "z"]
    assert len(ds) == 2 and len(list(ds)) == 2  # iteration stops at IndexError
    assert ds[0]["prompt"] == "prompt a" and _rgb(ds[0]["image"]) == [RED] * 4
    assert ds[1]["prompt"] == "prompt z" and _rgb(ds[1]["image"]) == [BLUE] * 4
    assert ds.skipped == {
        "unreadable_at_load": 0,
        "json_without_image": 1,
        "image_without_json": 2,
        "unreadable_at_init": 0,
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "1 .json without image (b.json)" in warnings[0]
    assert "2 image without .json (a_1.png, c.png)" in warnings[0]
    assert "using 2 pairs" in warnings[0]


def test_item_is_float_rgb_in_unit_range(tmp_path: Path) -> None:
    _prompt(tmp_path / "x.json", "grey")
    _image(tmp_path / "x.png", np.full((4, 4), 51, dtype=np.uint8))  # greyscale "L" image
    item = diffusers_dataset.get_dataset(_config(tmp_path))[0]
    assert set(item) == {"prompt", "image"}
    assert item["image"].dtype == torch.float32
    assert torch.allclose(item["image"], torch.full((3, 4, 4), 0.2))  # 51 / 255


def test_relative_local_dir_resolves_from_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    _prompt(tmp_path / "data" / "p.json", "p")
    _solid(tmp_path / "data" / "p.jpg", (200, 200, 200))
    monkeypatch.chdir(tmp_path)
    ds = diffusers_dataset.get_dataset(_config("data"))
    assert ds.directory == tmp_path / "data"
    assert ds[0]["prompt"] == "p"
    assert ds[0]["image"].mean().item() == pytest.approx(
        200 / 255, abs=2 / 255
    )  # JPEG: lossy by a level or two


# ------------------------------------------------------------------------------------------ resize and crop


def test_cover_size_and_center_offset_by_hand() -> None:
    assert common.cover_size((8, 16), (4, 4)) == (4, 8)  # scale 1/2, width limited by nothing
    assert common.cover_size((3, 5), (4, 4)) == (4, 7)  # scale 4/3: 5 * 4/3 = 6.67 -> 7
    assert common.cover_size((4, 4), (8, 2)) == (8, 8)  # upscale by 2 to cover the height
    assert common.crop_offset(0, random_crop=False) == 0
    assert common.crop_offset(4, random_crop=False) == 2
    assert common.crop_offset(3, random_crop=False) == 1


def test_center_crop_without_resize_keeps_exact_pixels(tmp_path: Path) -> None:
    wide = np.zeros((4, 8, 3), dtype=np.uint8)  # [H=4, W=8]: left half red, right half blue
    wide[:, :4] = RED
    wide[:, 4:] = BLUE
    _image(tmp_path / "w.png", wide)
    # cover scale = max(4/4, 4/8) = 1: no resize; center crop keeps columns 2..5
    assert _rgb(common.load_image(tmp_path / "w.png", [4, 4])) == [RED, RED, BLUE, BLUE]

    tall = np.zeros((8, 4, 3), dtype=np.uint8)  # [H=8, W=4]: rows 0..3 black, rows 4..7 white
    tall[4:] = 255
    _image(tmp_path / "t.png", tall)
    out = common.load_image(tmp_path / "t.png", [2, 4])  # no resize, extra 6 rows -> top = 3: rows 3 and 4
    assert torch.equal(out[:, 0], torch.zeros(3, 4)) and torch.equal(out[:, 1], torch.ones(3, 4))


def test_resize_to_cover_then_center_crop_drops_the_sides(tmp_path: Path) -> None:
    stripes = np.zeros((16, 64, 3), dtype=np.uint8)  # [H=16, W=64]: red 0..15 | green 16..47 | blue 48..63
    stripes[:, :16] = RED
    stripes[:, 16:48] = GREEN
    stripes[:, 48:] = BLUE
    _prompt(tmp_path / "s.json", "stripes")
    _image(tmp_path / "s.png", stripes)
    # cover: scale 1/4 -> [4, 16]; center crop columns 6..9 = input columns 24..39 (+- 8 of bicubic support): green.
    # A squash to 4x4 would instead show red in column 0 and blue in column 3.
    image = diffusers_dataset.get_dataset(_config(tmp_path, size=(4, 4)))[0]["image"]
    assert image.shape == (3, 4, 4)
    assert torch.equal(image, torch.tensor([0.0, 1.0, 0.0]).view(3, 1, 1).expand(3, 4, 4))


def test_random_crop_is_a_window_of_the_covered_image(tmp_path: Path) -> None:
    row = np.arange(8, dtype=np.uint8) * 30  # 8 distinct grey columns, H=2: no resize for a [2, 4] target
    _image(tmp_path / "g.png", np.repeat(np.repeat(row[None, :, None], 2, axis=0), 3, axis=2))
    starts = set()
    for seed in range(20):
        out = common.load_image(
            tmp_path / "g.png", [2, 4], random_crop=True, generator=torch.manual_seed(seed)
        )
        start = int(round(out[0, 0, 0].item() * 255)) // 30
        assert torch.allclose(out[0, 0], torch.tensor([30.0 * (start + k) for k in range(4)]) / 255)
        starts.add(start)
    assert starts <= set(range(5)) and len(starts) >= 3


def test_transparency_is_flattened_onto_white(tmp_path: Path) -> None:
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)  # black, fully transparent on the left half
    rgba[:, 2:, 3] = 255
    _image(tmp_path / "a.png", rgba)
    assert _rgb(common.load_image(tmp_path / "a.png", [4, 4])) == [(255, 255, 255)] * 2 + [(0, 0, 0)] * 2


def test_bad_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"policy\.diffusers\.inference_size"):
        common.check_size([512])
    with pytest.raises(ConfigError, match=r"two positive integers"):
        common.check_size([0, 512])


# ------------------------------------------------------------------------------------------------- errors


def test_empty_local_dir_names_the_key() -> None:
    with pytest.raises(DataError, match=r"`train\.train_policy\.dataset\.local_dir` is empty"):
        diffusers_dataset.get_dataset(_config(""))


def test_missing_dir_and_file_instead_of_dir(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nowhere.*does not exist"):
        diffusers_dataset.get_dataset(_config(tmp_path / "nowhere"))
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(DataError, match=r"f\.txt.*is not a directory"):
        diffusers_dataset.get_dataset(_config(tmp_path / "f.txt"))


def test_no_pairs_reports_what_was_seen(tmp_path: Path) -> None:
    _prompt(tmp_path / "a.json", "a")
    _prompt(tmp_path / "b.json", "b")
    _solid(tmp_path / "c.png", RED)
    with pytest.raises(
        DataError, match=r"no <stem>\.json \+ <stem>\.<image> pairs found \(saw 2 \.json and 1 image"
    ):
        diffusers_dataset.get_dataset(_config(tmp_path))


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ('{"caption": "x"}', r'a\.json.* has no "prompt" field'),
        ('{"prompt": 3}', r'a\.json.* has a non-string "prompt" field \(got int\)'),
        ('["a list"]', r'a\.json.* has no "prompt" field'),
        ('{"prompt": "x",}', r"Malformed JSON in .*a\.json.*: Expecting property name .*line 1 column 16"),
    ],
)
def test_bad_json_names_the_file_and_reason(tmp_path: Path, content: str, pattern: str) -> None:
    (tmp_path / "a.json").write_text(content)
    _solid(tmp_path / "a.png", RED)
    with pytest.raises(DataError, match=pattern):
        diffusers_dataset.get_dataset(_config(tmp_path))


def test_two_images_with_one_stem_are_ambiguous(tmp_path: Path) -> None:
    _prompt(tmp_path / "a.json", "a")
    _solid(tmp_path / "a.png", RED)
    _solid(tmp_path / "a.jpg", RED)
    with pytest.raises(DataError, match=r"'a': a\.jpg, a\.png"):
        diffusers_dataset.get_dataset(_config(tmp_path))


# -------------------------------------------------------------------------------------------- corrupt images


def test_corrupt_image_is_skipped_at_construction(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _prompt(tmp_path / "a.json", "broken")
    (tmp_path / "a.png").write_bytes(b"not an image at all")
    _prompt(tmp_path / "b.json", "fine")
    _solid(tmp_path / "b.png", GREEN)
    with caplog.at_level(logging.WARNING):
        ds = diffusers_dataset.get_dataset(_config(tmp_path))
    assert [s.stem for s in ds.samples] == ["b"]
    assert ds.skipped["unreadable_at_init"] == 1
    assert any("skipped 1 unreadable image(s) (a.png)" in r.getMessage() for r in caplog.records)


def test_all_images_corrupt_is_an_error(tmp_path: Path) -> None:
    _prompt(tmp_path / "a.json", "broken")
    (tmp_path / "a.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(DataError, match=r"none of the 1 paired images can be read"):
        diffusers_dataset.get_dataset(_config(tmp_path))


def _truncated_jpeg(path: Path) -> None:
    """A JPEG cut in half: PIL's verify() accepts it, decoding fails."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])


def test_undecodable_image_is_skipped_at_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _prompt(tmp_path / "a.json", "truncated")
    _truncated_jpeg(tmp_path / "a.jpg")
    _prompt(tmp_path / "b.json", "fine")
    _solid(tmp_path / "b.png", GREEN)
    ds = diffusers_dataset.get_dataset(_config(tmp_path))
    assert len(ds) == 2  # verify() passed the truncated file
    with caplog.at_level(logging.WARNING):
        first, again = ds[0], ds[0]
    assert first["prompt"] == again["prompt"] == "fine" and _rgb(first["image"]) == [GREEN] * 4
    assert ds.skipped["unreadable_at_load"] == 1  # counted (and warned) once, then remembered
    assert sum("a.jpg" in r.getMessage() for r in caplog.records) == 1


def test_every_image_undecodable_at_load_is_an_error(tmp_path: Path) -> None:
    _prompt(tmp_path / "a.json", "truncated")
    _truncated_jpeg(tmp_path / "a.jpg")
    ds = diffusers_dataset.get_dataset(_config(tmp_path))
    with pytest.raises(DataError, match=r"every image failed to decode"):
        ds[0]


# ------------------------------------------------------------------------------------ RL mode and validation


def test_grpo_mode_yields_prompts_only_from_every_json(tmp_path: Path) -> None:
    _prompt(tmp_path / "b.json", "second")
    _prompt(tmp_path / "a.json", "first")
    (tmp_path / "a.png").write_bytes(b"corrupt, but never opened in prompt mode")
    ds = diffusers_dataset.get_dataset(_config(tmp_path, task="grpo"))
    assert [ds[i] for i in range(len(ds))] == [
        {"prompt": "first", "metadata": {}},
        {"prompt": "second", "metadata": {}},
    ]
    batch = diffusers_dataset.collate([ds[0], ds[1]])
    assert batch == {"prompt": ["first", "second"], "metadata": [{}, {}]}


def test_grpo_mode_without_json_is_an_error(tmp_path: Path) -> None:
    _solid(tmp_path / "a.png", RED)
    with pytest.raises(DataError, match=r"no <stem>\.json prompt files found \(saw 1 image"):
        diffusers_dataset.get_dataset(_config(tmp_path, task="grpo"))


def test_val_dataset_is_optional_and_names_its_own_key(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert diffusers_dataset.get_val_dataset(config) is None
    config.validation.dataset.local_dir = str(tmp_path / "val")
    with pytest.raises(DataError, match=r"`validation\.dataset\.local_dir`.*does not exist"):
        diffusers_dataset.get_val_dataset(config)
    (tmp_path / "val").mkdir()
    _prompt(tmp_path / "val" / "v.json", "val prompt")
    Image.new("RGB", (4, 4), BLUE).save(tmp_path / "val" / "v.webp", lossless=True)
    ds = diffusers_dataset.get_val_dataset(config)
    assert ds[0]["prompt"] == "val prompt" and _rgb(ds[0]["image"]) == [BLUE] * 4


# ------------------------------------------------------------------------------------------------ collate


def test_collate_stacks_images_and_lists_the_rest() -> None:
    items = [{"prompt": f"p{i}", "image": torch.full((3, 2, 4), float(i))} for i in range(3)]
    batch = common.collate(items)
    assert batch["prompt"] == ["p0", "p1", "p2"]
    assert batch["image"].shape == (3, 3, 2, 4)
    assert batch["image"][:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]


def test_collate_rejects_inconsistent_items() -> None:
    with pytest.raises(PluginError, match=r"different keys"):
        common.collate([{"prompt": "a", "image": torch.zeros(3, 2, 2)}, {"prompt": "b"}])
    with pytest.raises(PluginError, match=r"different shapes.*policy\.diffusers\.inference_size"):
        common.collate([{"image": torch.zeros(3, 2, 2)}, {"image": torch.zeros(3, 4, 4)}])


def test_module_honours_the_plugin_contract() -> None:
    module = resolve_plugin("sanarl.datasets.diffusers_dataset")
    check_plugin(module)
    assert module is diffusers_dataset and module.collate is common.collate
