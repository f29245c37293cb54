"""Video rewards: frames scored by an image reward and reduced per clip; per-entry reward options from the config."""

from __future__ import annotations

import pytest
import torch

from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.errors import ConfigError
from sanarl.rewards import RewardFunction
from sanarl.rewards.base import Reward, RewardInputError
from sanarl.rewards.video import frames_as_images, reduce_frames, score_video


class MeanPixel(Reward):
    """Score = mean pixel value of each image (one key)."""

    name = "mean_pixel"
    keys = ("value",)
    default_key = "value"

    def __init__(self, offset: float = 0.0) -> None:
        super().__init__()
        self.offset = offset

    def _score(self, images, prompts, metadata):
        return {"value": images.mean(dim=(1, 2, 3)) + self.offset}


def _clips() -> torch.Tensor:
    """Two clips of 4 frames; frame t of clip b is uniformly (b + 1) * (t + 1) / 10."""
    values = torch.tensor([[(b + 1) * (t + 1) / 10 for t in range(4)] for b in range(2)])
    return values[:, None, :, None, None].expand(2, 3, 4, 5, 6).clone()


def test_frames_are_clip_major_and_strided() -> None:
    frames, per_clip = frames_as_images(_clips(), stride=2)
    assert per_clip == 2
    assert frames[:, 0, 0, 0].tolist() == pytest.approx([0.1, 0.3, 0.2, 0.6])


@pytest.mark.parametrize(
    ("reduction", "expected"),
    [("mean", [0.25, 0.5]), ("min", [0.1, 0.2]), ("max", [0.4, 0.8]), ("median", [0.2, 0.4])],
)
def test_score_video_reduces_per_clip(reduction: str, expected: list[float]) -> None:
    scores = score_video(MeanPixel(), _clips(), ["a", "b"], reduction=reduction)
    assert scores["value"].tolist() == pytest.approx(expected)


def test_score_video_rejects_bad_layout_and_counts() -> None:
    with pytest.raises(RewardInputError, match=r"\[B, C, T, H, W\]"):
        score_video(MeanPixel(), torch.rand(2, 3, 8, 8), ["a", "b"])
    with pytest.raises(RewardInputError, match="2 clips but 1 prompts"):
        score_video(MeanPixel(), _clips(), ["a"])
    with pytest.raises(RewardInputError, match="not one of"):
        reduce_frames(torch.zeros(4), 2, "mode")


def test_reward_function_scores_video_with_config_stride_and_entry_options() -> None:
    config = RemoteRewardConfig(
        reward_fns=[RewardFnConfig(name="mean_pixel", options={"offset": 1.0})],
        video_frame_stride=3,
        video_frame_reduction="max",
    )
    from sanarl.rewards import registry

    registry.register("mean_pixel")(MeanPixel)
    try:
        fn = RewardFunction(config)
        result = fn(_clips(), ["a", "b"])
    finally:
        registry.unregister("mean_pixel")
    # frames 0 and 3 kept; max over them, plus the entry's offset option
    assert result.total.tolist() == pytest.approx([1.4, 1.8])


def test_unknown_reward_option_is_a_config_error() -> None:
    from sanarl.rewards import registry

    registry.register("mean_pixel")(MeanPixel)
    try:
        config = RemoteRewardConfig(reward_fns=[RewardFnConfig(name="mean_pixel", options={"offst": 1.0})])
        with pytest.raises(ConfigError, match="offst"):
            RewardFunction(config)
    finally:
        registry.unregister("mean_pixel")
