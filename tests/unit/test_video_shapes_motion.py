"""The moving-shapes world (sanarl.worlds.moving_shapes), its plugin wiring and the `motion` reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sanarl.config.schema import Config, RemoteRewardConfig, RewardFnConfig
from sanarl.datasets import shapes
from sanarl.errors import DataError
from sanarl.models.tiny_video import VIDEO_VOCABULARY
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.scorers.motion import MotionReward
from sanarl.worlds import moving_shapes
from sanarl.worlds import shapes as world


def clips_of(split: str, count: int, size: int = 16, frames: int = 8) -> tuple[torch.Tensor, list[dict]]:
    """Ground-truth clips [B, 3, T, H, W] in [0, 1] and their metadata rows."""
    rows, clips = [], []
    for i in range(count):
        row, seed = moving_shapes.sample_item(split, 3, i)
        rows.append(row)
        clips.append(torch.from_numpy(moving_shapes.render_clip(row, size, frames, seed)).permute(3, 0, 1, 2))
    return torch.stack(clips).float() / 255.0, rows


def video_config(kind: str = "sft") -> Config:
    cfg = Config()
    cfg.policy.diffusers.is_video = True
    cfg.policy.diffusers.inference_size = [16, 16]
    cfg.policy.diffusers.train_frames = 6
    cfg.train.train_policy.type = kind
    cfg.train.train_policy.dataset.size = 10
    return cfg


def test_splits_partition_the_48_combinations_and_captions_fit_the_tokenizer():
    train, test = moving_shapes.combinations("train"), moving_shapes.combinations("heldout")
    assert len(train) + len(test) == 4 * 3 * 4 and not set(train) & set(test)
    assert ("red", "circle", "left") in test  # (0 + 0 + 0) % 6 == 0
    for color, shape, direction in train + test:
        words = moving_shapes.caption(color, shape, direction).split()
        assert set(words) <= set(VIDEO_VOCABULARY)
    assert {d for _, _, d in train} == set(moving_shapes.DIRECTIONS)


def test_path_starts_near_the_centre_moves_the_asked_way_and_stays_inside():
    for direction, (ux, uy) in moving_shapes.DIRECTIONS.items():
        for seed in range(20):
            path = moving_shapes.plan_path(direction, 16, 8, seed)
            free = 16 - 2 * moving_shapes.MARGIN - path.side
            along0 = path.x0 if ux else path.y0
            assert abs(along0 - 8) <= moving_shapes.START_SPREAD * free + 1e-9
            assert (path.vx, path.vy) == pytest.approx(
                (ux * abs(path.vx + path.vy), uy * abs(path.vx + path.vy))
            )
            for t in (0, 7):
                cx, cy = path.x0 + t * path.vx, path.y0 + t * path.vy
                half = path.side / 2 + moving_shapes.MARGIN
                assert half - 1e-9 <= cx <= 16 - half + 1e-9 and half - 1e-9 <= cy <= 16 - half + 1e-9


def test_render_is_deterministic_and_draws_one_shape_of_the_right_colour():
    row = moving_shapes.metadata_row("blue", "square", "down")
    a, b = moving_shapes.render_clip(row, 16, 8, 5), moving_shapes.render_clip(row, 16, 8, 5)
    assert a.shape == (8, 16, 16, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
    brightest = a.reshape(-1, 3)[a.reshape(-1, 3).sum(1).argmax()]
    assert tuple(brightest) == world.PALETTE["blue"]


def test_track_and_displacement_on_a_hand_built_clip():
    """A 2x2 white block at columns 2-3 in frame 0, moved 3 px right per frame: centroids x = 3, 6, 9; D = (6, 0)."""
    clip = np.zeros((3, 8, 16, 3)) + np.asarray(world.BACKGROUND) / 255
    for t in range(3):
        clip[t, 3:5, 2 + 3 * t : 4 + 3 * t] = 1.0
    cents = moving_shapes.track(clip)
    np.testing.assert_allclose(cents, [[3, 4], [6, 4], [9, 4]])
    np.testing.assert_allclose(moving_shapes.displacement(cents), [6, 0])
    result = moving_shapes.judge_motion(clip, "right")
    assert result.direction == pytest.approx(1.0) and result.travel == pytest.approx(6 / 16)
    assert moving_shapes.judge_motion(clip, "left").direction == pytest.approx(0.0)
    assert moving_shapes.judge_motion(clip, "up").direction == pytest.approx(
        0.5
    )  # sideways: (1 + cos 90) / 2


def test_motion_reward_is_one_on_ground_truth_and_zero_on_reversed_clips():
    clips, rows = clips_of("train", 24)
    prompts = [r["prompt"] for r in rows]
    reward = MotionReward()
    truth = reward.score(clips, prompts, rows)
    assert truth["direction"].min() > 0.99 and truth["visible"].min() == 1.0
    # >= 0.8 of the room left of a start within 0.1 of the free range from the centre: >= 0.15 of the side
    assert truth["travel"].min() >= moving_shapes.MIN_TRAVEL
    reversed_ = reward.score(clips.flip(2), prompts, rows)
    assert reversed_["direction"].max() < 0.01
    still = reward.score(clips[:, :, :1].expand(-1, -1, 8, -1, -1).contiguous(), prompts, rows)
    assert still["direction"].max() == 0.0


def test_motion_reward_judges_every_frame_as_a_shapes_image_so_texture_and_wrong_colours_show():
    """`strict`, `exact`, `exact_partial`, `background`, `specks`, `entropy`: per-frame shapes-world checks averaged
    over the frames; `direction_exact`: the direction times the frames' credit of "the named object, nothing else"."""
    clips, rows = clips_of("train", 6)
    prompts = [r["prompt"] for r in rows]
    truth = MotionReward().score(clips, prompts, rows)
    for key in ("strict", "exact", "exact_partial"):
        assert truth[key].tolist() == [1.0] * 6, key
    assert truth["specks"].tolist() == [0.0] * 6
    assert torch.equal(truth["direction_exact"], truth["direction"])
    # one isolated off-background pixel in every other frame of clip 0: a speck (below min_blob_area) half the time
    speckled = clips.clone()
    corner = torch.tensor([1.0, 0.0, 1.0])  # magenta: far from the background and from every palette colour
    speckled[0, :, ::2, 0, 0] = corner[:, None]
    out = MotionReward().score(speckled, prompts, rows)
    frames = speckled.shape[2]
    assert out["specks"][0].item() == pytest.approx(0.5)
    assert out["background"][0].item() == pytest.approx(truth["background"][0].item() - 0.5 / (16 * 16))
    assert out["direction"][0].item() == pytest.approx(truth["direction"][0].item(), abs=0.01)
    # a speck is not an object (exact_partial keeps 1) but it is other foreground: direction_exact's "nothing more"
    # clause fails on the 4 speckled frames, 2 of 3 clauses hold there -> direction x (4 + 4 x 2/3) / 8
    assert out["exact_partial"][0].item() == 1.0
    assert out["direction_exact"][0].item() == pytest.approx(out["direction"][0].item() * (4 + 4 * 2 / 3) / 8)
    # the clip's object recoloured in the last 3 frames (another palette colour): strict holds on 5 of 8 frames
    row = rows[1]
    other = next(c for c in world.PALETTE if c != row["include"][0]["color"])
    recoloured = clips.clone()
    rgb = torch.tensor(world.PALETTE[other], dtype=torch.float32) / 255.0
    frames_ = recoloured[1, :, frames - 3 :]
    background = torch.tensor(world.BACKGROUND, dtype=torch.float32)[:, None, None, None] / 255.0
    is_object = (frames_ - background).abs().sum(dim=0, keepdim=True) > 0.3
    recoloured[1, :, frames - 3 :] = torch.where(is_object, rgb[:, None, None, None], frames_)
    changed = MotionReward().score(recoloured, prompts, rows)
    assert changed["strict"][1].item() == pytest.approx(5 / 8)
    assert changed["exact"][1].item() == pytest.approx(5 / 8)
    # a recoloured frame: of GenEval's clauses "one <shape>" holds and "<colour>" fails, "nothing more" holds -> 2/3
    assert changed["exact_partial"][1].item() == pytest.approx((5 * 1.0 + 3 * 2 / 3) / 8)
    assert changed["direction_exact"][1].item() == pytest.approx(changed["direction"][1].item() * 7 / 8)
    # a row with a `motion` field but no object, on a caption outside the motion grammar: strict is NaN, the rest not
    bare = MotionReward().score(clips[:1], ["something moving"], [{"motion": rows[0]["motion"]}])
    for key in ("strict", "exact", "exact_partial", "direction_exact"):
        assert torch.isnan(bare[key]).all(), key
    assert bare["direction"].item() > 0.99 and bare["specks"].item() == 0.0


def test_motion_reward_marks_non_finite_clips_nan_and_rejects_bad_input():
    clips, rows = clips_of("test", 2)
    clips[1, 0, 3, 2, 2] = float("nan")
    out = MotionReward().score(clips, [r["prompt"] for r in rows], rows)
    assert out["direction"][0] > 0.99 and torch.isnan(out["direction"][1])
    with pytest.raises(RewardInputError, match=r"reward 'motion' scores video clips.*\[B, C, T, H, W\]"):
        MotionReward().score(clips[:, :, 0], ["a", "b"], rows)
    with pytest.raises(RewardInputError, match=r"prompt 'p' has no moving-shapes metadata.*motion grammar"):
        MotionReward().score(clips[:1].nan_to_num(), ["p"], [{"prompt": "p"}])


def test_reward_function_passes_whole_clips_to_a_video_native_reward():
    """RewardFunction scores image rewards frame-wise but hands clips to `video_native` rewards (combine.py)."""
    from sanarl.rewards.combine import RewardFunction

    clips, rows = clips_of("train", 4)
    config = RemoteRewardConfig(reward_fns=[RewardFnConfig(name="motion", weight=2.0)])
    result = RewardFunction(config)(clips, [r["prompt"] for r in rows], rows)
    torch.testing.assert_close(result.total, torch.full((4,), 2.0), atol=0.02, rtol=0)


def test_shapes_plugin_serves_clips_in_video_mode():
    cfg = video_config()
    ds = shapes.get_dataset(cfg)
    item = ds[3]
    assert item["video"].shape == (3, 6, 16, 16)
    assert (
        item["metadata"]["motion"] in moving_shapes.DIRECTIONS
        and item["prompt"] == item["metadata"]["prompt"]
    )
    row, seed = moving_shapes.sample_item("train", cfg.train.seed, 3)
    expected = torch.from_numpy(moving_shapes.render_clip(row, 16, 6, seed)).permute(3, 0, 1, 2).float() / 255
    assert torch.equal(item["video"], expected)
    rl = shapes.get_dataset(video_config("grpo"))[3]
    assert set(rl) == {"prompt", "metadata"} and rl["prompt"] == item["prompt"]
    val = shapes.get_val_dataset(cfg)
    assert set(val[0]) == {"prompt", "metadata"}
    seen = set()
    for i in range(8):
        meta = val[i]["metadata"]
        seen.add((meta["include"][0]["color"], meta["include"][0]["class"], meta["motion"]))
    assert seen <= set(moving_shapes.combinations("test"))


def test_bad_clip_size_names_the_key():
    cfg = video_config()
    cfg.policy.diffusers.inference_size = [12, 12]
    with pytest.raises(DataError, match=r"policy\.diffusers\.inference_size.*multiple of 8"):
        shapes.get_dataset(cfg)
    cfg = video_config()
    cfg.policy.diffusers.train_frames = 1
    with pytest.raises(DataError, match=r"policy\.diffusers\.train_frames"):
        shapes.get_dataset(cfg)
