"""Video files and the video mode of `sanarl.datasets.diffusers_dataset`: mp4 round trip, frame window, resize,
short / corrupt videos, and the mp4 sample grids (sanarl.core.media)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from sanarl.config.schema import Config
from sanarl.core import media
from sanarl.datasets import diffusers_dataset as dd
from sanarl.errors import DataError

pytest.importorskip("av")

TOL = 6 / 255  # H.264 at crf 0 with 4:2:0 chroma on flat colours: a few levels at most


def level_clip(frames: int, height: int = 16, width: int = 16) -> np.ndarray:
    """Frame k is a flat grey of level 8 + 16 k (so a decoded frame tells its index), uint8 [T, H, W, 3]."""
    levels = 8 + 16 * np.arange(frames, dtype=np.int64)
    return np.broadcast_to(levels[:, None, None, None], (frames, height, width, 3)).astype(np.uint8).copy()


def frame_index(frame: torch.Tensor) -> int:
    """Inverse of level_clip for a decoded float frame [3, H, W] in [0, 1]."""
    return round((frame.mean().item() * 255 - 8) / 16)


def write_pair(folder: Path, stem: str, frames: np.ndarray, prompt: str = "a clip") -> Path:
    (folder / f"{stem}.json").write_text(json.dumps({"prompt": prompt}))
    return media.write_video(folder / f"{stem}.mp4", frames, crf=0)


def video_config(folder: Path, frames: int = 4, size: tuple[int, int] = (8, 8), kind: str = "sft") -> Config:
    cfg = Config()
    cfg.policy.diffusers.is_video = True
    cfg.policy.diffusers.train_frames = frames
    cfg.policy.diffusers.inference_size = list(size)
    cfg.train.train_policy.type = kind
    cfg.train.train_policy.dataset.local_dir = str(folder)
    return cfg


def test_write_then_read_round_trips_frames(tmp_path):
    clip = level_clip(10, 16, 24)
    path = media.write_video(tmp_path / "a.mp4", clip, crf=0)
    assert media.probe_frames(path) == 10
    back = media.read_video(path)
    assert back.shape == (10, 16, 24, 3)
    assert np.abs(back.astype(int) - clip.astype(int)).max() <= 255 * TOL
    window = media.read_video(path, start=3, count=4)
    assert np.array_equal(window, back[3:7])


def test_odd_sizes_are_padded_to_even(tmp_path):
    path = media.write_video(tmp_path / "odd.mp4", level_clip(3, 7, 9), crf=0)
    assert media.read_video(path).shape == (3, 8, 10, 3)


def test_plugin_round_trips_an_mp4_and_takes_the_seeded_window(tmp_path):
    write_pair(tmp_path, "0001", level_clip(12), "a red ball rolls")
    ds = dd.get_dataset(video_config(tmp_path, frames=4))
    item = ds[0]
    assert item["prompt"] == "a red ball rolls"
    assert item["video"].shape == (3, 4, 8, 8) and item["video"].dtype == torch.float32
    start = dd.window_start(12, 4, Config().train.seed, 0)
    assert [frame_index(item["video"][:, t]) for t in range(4)] == list(range(start, start + 4))
    assert torch.equal(ds[0]["video"], item["video"])  # a pure function of (seed, index): resume-exact


def test_window_starts_cover_every_valid_start_uniformly():
    starts = [dd.window_start(10, 4, 0, i) for i in range(700)]
    counts = np.bincount(starts, minlength=7)
    assert len(counts) == 7 and counts.min() > 70  # 7 valid starts, ~100 each
    assert dd.window_start(4, 4, 0, 5) == 0


def test_frames_are_resized_to_cover_then_center_cropped(tmp_path):
    """A 16x32 frame whose left half is black and right half white, resized to cover 8x8 (-> 8x16) and
    center-cropped: the crop is columns 4..11 of the resized frame, so its left half is dark, right half bright."""
    frame = np.zeros((16, 32, 3), dtype=np.uint8)
    frame[:, 16:] = 255
    write_pair(tmp_path, "a", np.stack([frame] * 3))
    clip = dd.get_dataset(video_config(tmp_path, frames=2))[0]["video"]
    assert clip.shape == (3, 2, 8, 8)
    assert clip[:, :, :, :3].max() < 0.1 and clip[:, :, :, 5:].min() > 0.9


def test_short_and_corrupt_videos_are_skipped_counted_and_reported(tmp_path, caplog):
    write_pair(tmp_path, "good", level_clip(6))
    write_pair(tmp_path, "short", level_clip(3))
    (tmp_path / "broken.json").write_text(json.dumps({"prompt": "x"}))
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    (tmp_path / "lonely.json").write_text(json.dumps({"prompt": "no video"}))
    with caplog.at_level(logging.WARNING):
        ds = dd.get_dataset(video_config(tmp_path, frames=5))
    assert [s.stem for s in ds.samples] == ["good"]
    assert ds.skipped["too_short"] == 1 and ds.skipped["unreadable_at_init"] == 1
    assert ds.skipped["json_without_image"] == 1
    text = caplog.text
    assert "shorter than train_frames = 5" in text and "short.mp4 (3)" in text and "broken.mp4" in text


def test_no_usable_video_is_a_data_error_naming_the_key_and_the_fix(tmp_path):
    write_pair(tmp_path, "short", level_clip(3))
    with pytest.raises(
        DataError, match=r"train\.train_policy\.dataset\.local_dir.*1 shorter than .*train_frames"
    ):
        dd.get_dataset(video_config(tmp_path, frames=5))


def test_video_mode_ignores_images_and_rl_mode_reads_prompts_only(tmp_path):
    write_pair(tmp_path, "v", level_clip(4))
    (tmp_path / "i.json").write_text(json.dumps({"prompt": "an image"}))
    (tmp_path / "i.png").write_bytes(b"")  # an image never pairs in video mode
    ds = dd.get_dataset(video_config(tmp_path, frames=2))
    assert [s.stem for s in ds.samples] == ["v"] and ds.skipped["json_without_image"] == 1
    rl = dd.get_dataset(video_config(tmp_path, frames=2, kind="grpo"))
    assert [rl[i]["prompt"] for i in range(len(rl))] == ["an image", "a clip"]


def test_save_video_grid_tiles_every_clip_with_its_caption(tmp_path):
    clips = torch.zeros(3, 3, 5, 4, 4)
    clips[1] = 1.0  # clip 1 white, others black
    path = media.save_video_grid(clips, ["a", "b", "c"], tmp_path / "g.mp4", columns=2, tile=16)
    frames = media.read_video(path)
    assert frames.shape == (5, 2 * (16 + 34), 2 * 16, 3)
    assert frames[:, 2:14, 18:30].min() > 230  # tile 1 (row 0, column 1) is white
    assert frames[:, 2:14, 2:14].max() < 25  # tile 0 is black


def test_save_media_picks_png_for_images_and_mp4_for_clips(tmp_path):
    png = media.save_media(torch.rand(2, 3, 4, 4), ["a", "b"], tmp_path / "step_1")
    mp4 = media.save_media(torch.rand(2, 3, 3, 4, 4), ["a", "b"], tmp_path / "step_2")
    assert png.name == "step_1.png" and png.is_file()
    assert mp4.name == "step_2.mp4" and media.probe_frames(mp4) == 3
