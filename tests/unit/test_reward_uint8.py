"""The uint8 entry point `Reward.score_uint8` (what the reward service's worker calls): rewards that judge uint8
pixels (`Uint8Reward`) score them with no float round trip and agree exactly with `score` on the decoded floats;
float rewards score `from_uint8(pixels)`; bad input is refused with the reward's name."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.rewards import Reward, RewardInputError, base
from sanarl.rewards.base import Uint8Reward, from_uint8, to_uint8
from sanarl.rewards.scorers.jpeg import JpegCompressibility, JpegIncompressibility
from sanarl.rewards.scorers.motion import MotionReward
from sanarl.rewards.scorers.shapes import ShapesReward
from sanarl.worlds import moving_shapes
from sanarl.worlds import shapes as world


def random_pixels(count: int, size: int, seed: int) -> torch.Tensor:
    """uint8 `[B, 3, H, W]` as the worker passes them: a permuted view of `[B, H, W, 3]` pixels."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, size, size, 3), dtype=torch.uint8, generator=generator).permute(
        0, 3, 1, 2
    )


def assert_same_scores(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


class MeanPixel(Reward):
    """A float reward: the mean pixel in [0, 1] and the prompt length; counts its loads."""

    name = "mean_pixel"
    keys = ("mean", "chars")
    default_key = "mean"

    def __init__(self) -> None:
        super().__init__()
        self.loads, self.seen = 0, []

    def _load(self) -> None:
        self.loads += 1

    def _score(self, images, prompts, metadata):
        self.seen.append(images.dtype)
        return {"mean": images.double().mean(dim=(1, 2, 3)), "chars": [float(len(p)) for p in prompts]}


class PixelSum(Uint8Reward):
    """A uint8 reward that records the pixels its core gets."""

    name = "pixel_sum"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def _score_uint8(self, pixels, prompts, metadata):
        self.seen.append(pixels)
        return {"pixel_sum": pixels.flatten(1).sum(1, dtype=torch.int64).double()}


def test_to_uint8_inverts_from_uint8_on_every_value() -> None:
    """`round(255 (u / 255)) == u` for all 256 values: why the service's uint8 path and the float path agree."""
    values = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(to_uint8(from_uint8(values)), values)
    decoded = from_uint8(values).double()  # float32 u / 255, within float32 round-off of the exact quotient
    assert float((decoded * 255.0 - values.double()).abs().max()) < 1e-4  # far inside the rounding half-step


def test_channels_last_quantisation_holds_round_255x_in_an_interleaved_buffer() -> None:
    """`to_uint8_channels_last`: the values of round(255 x) clamped (derived here by hand: ties to even, round-off
    beyond [0, 1] clamped), in memory laid out [B, H, W, 3]; uint8 pixels are copied only when not already so."""
    ties = torch.tensor([0.5, 1.5, 2.5, 127.5, 254.5]) / 255.0
    edges = torch.tensor([0.0, 1.0, -1e-7, 1.0 + 1e-7, 0.2, 0.999])
    values = torch.cat(
        [ties, edges, torch.rand(2 * 3 * 5 * 4 - 11, generator=torch.Generator().manual_seed(0))]
    )
    images = values.view(2, 3, 5, 4)
    scaled = images.flatten().numpy() * np.float32(255.0)  # the product in float32, as torch forms it
    by_hand = [min(255, max(0, round(float(v)))) for v in scaled]  # Python's round: half to even
    out = base.to_uint8_channels_last(images)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert out.permute(0, 2, 3, 1).is_contiguous()
    assert out.flatten().tolist() == by_hand
    assert torch.equal(out, to_uint8(images))
    stored_last = images.contiguous(memory_format=torch.channels_last)  # a decode's layout: kept
    kept = base.to_uint8_channels_last(stored_last)
    assert kept.permute(0, 2, 3, 1).is_contiguous() and kept.flatten().tolist() == by_hand
    interleaved = random_pixels(2, 4, seed=1)  # channels-last already: returned as is
    assert base.to_uint8_channels_last(interleaved) is interleaved
    planar = interleaved.contiguous()
    copied = base.to_uint8_channels_last(planar)
    assert copied.permute(0, 2, 3, 1).is_contiguous() and torch.equal(copied, planar)
    hwc = base.to_uint8_hwc(images)
    assert hwc.flags["C_CONTIGUOUS"] and hwc.shape == (2, 5, 4, 3)
    assert hwc.transpose(0, 3, 1, 2).flatten().tolist() == by_hand


@pytest.mark.parametrize("reward_class", [JpegCompressibility, JpegIncompressibility])
def test_jpeg_scores_uint8_pixels_as_it_scores_their_floats(reward_class) -> None:
    """Equal to `score(from_uint8(u))` bit for bit, and to the JPEG size of the pixels saved by hand."""
    pixels = random_pixels(5, 24, seed=1)
    reward = reward_class()
    direct = reward.score_uint8(pixels, ["p"] * 5)
    assert_same_scores(direct, reward.score(from_uint8(pixels), ["p"] * 5))
    sizes = []
    for array in pixels.permute(0, 2, 3, 1).numpy():
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=95)
        sizes.append(len(buffer.getvalue()) / 1000.0)
    assert direct["jpeg_kb"].tolist() == pytest.approx(sizes, rel=1e-6)
    expected = [-kb / 500.0 for kb in sizes] if reward_class is JpegCompressibility else sizes
    assert direct[reward.default_key].tolist() == pytest.approx(expected, rel=1e-6)


def test_shapes_judges_uint8_pixels_as_it_judges_their_floats() -> None:
    """Random pixels and ground-truth renders (which pass every clause) score the same both ways."""
    rows = [
        world.list_prompts("train")[tag][0] for tag in ("single_object", "two_object", "counting", "colors")
    ]
    prompts = [row["prompt"] for row in rows]
    reward = ShapesReward()
    noise = random_pixels(4, 32, seed=2)
    assert_same_scores(
        reward.score_uint8(noise, prompts, rows), reward.score(from_uint8(noise), prompts, rows)
    )
    renders = torch.from_numpy(np.stack([world.render(row, 32, seed=i) for i, row in enumerate(rows)]))
    renders = renders.permute(0, 3, 1, 2)
    direct = reward.score_uint8(renders, prompts, rows)
    assert_same_scores(direct, reward.score(from_uint8(renders), prompts, rows))
    assert direct["strict"].tolist() == [1.0] * 4 and direct["partial"].tolist() == [1.0] * 4


def test_uint8_rewards_never_convert_the_pixels_to_float_and_back(monkeypatch) -> None:
    """`score_uint8` hands the core the pixels it got, uncopied; `score` hands it `to_uint8(images)`."""
    pixels = random_pixels(3, 8, seed=3)
    reward = PixelSum()

    def refuse(*args, **kwargs):
        raise AssertionError("uint8 pixels went through a float round trip")

    with monkeypatch.context() as patch:
        patch.setattr(base, "from_uint8", refuse)
        patch.setattr(base, "to_uint8", refuse)
        scores = reward.score_uint8(pixels, ["a", "b", "c"])
        jpeg = JpegCompressibility().score_uint8(pixels, ["a", "b", "c"])
    got = reward.seen[0]  # the same memory and strides: not even a copy
    assert (
        got.data_ptr() == pixels.data_ptr() and got.stride() == pixels.stride() and torch.equal(got, pixels)
    )
    assert scores["pixel_sum"].tolist() == [float(p.sum(dtype=torch.int64)) for p in pixels]
    assert torch.equal(jpeg["jpeg_kb"], JpegCompressibility().score(from_uint8(pixels), ["a"] * 3)["jpeg_kb"])
    images = from_uint8(pixels)
    assert_same_scores(reward.score(images, ["a", "b", "c"]), scores)
    assert reward.seen[1].dtype == torch.uint8 and torch.equal(reward.seen[1], pixels)


def test_float_rewards_score_the_decoded_pixels() -> None:
    """A reward without a uint8 core scores `from_uint8(pixels)` (set up first, as `score` does)."""
    pixels = random_pixels(4, 8, seed=4)
    prompts = ["a", "bb", "ccc", "dddd"]
    reward = MeanPixel()
    direct = reward.score_uint8(pixels, prompts)
    assert reward.loads == 1 and reward.seen == [torch.float32]
    assert_same_scores(direct, MeanPixel().score(from_uint8(pixels), prompts))
    by_hand = (pixels.double() / 255.0).mean(dim=(1, 2, 3))
    assert direct["mean"].tolist() == pytest.approx(by_hand.tolist(), abs=1e-6)
    assert direct["chars"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_video_native_reward_scores_uint8_clips_like_their_floats() -> None:
    """`motion` keeps the default path: uint8 clips `[B, 3, T, H, W]` pass its clip check and score as their floats."""
    rows, clips = [], []
    for i in range(2):
        row, seed = moving_shapes.sample_item("train", 3, i)
        rows.append(row)
        clips.append(torch.from_numpy(moving_shapes.render_clip(row, 16, 6, seed)).permute(3, 0, 1, 2))
    pixels, prompts = torch.stack(clips), [row["prompt"] for row in rows]
    reward = MotionReward()
    direct = reward.score_uint8(pixels, prompts, rows)
    assert_same_scores(direct, reward.score(from_uint8(pixels), prompts, rows))
    assert min(direct["direction"].tolist()) > 0.9
    with pytest.raises(RewardInputError, match="reward 'motion' scores video clips"):
        reward.score_uint8(pixels[:, :, 0], prompts, rows)


@pytest.mark.parametrize("reward_class", [JpegCompressibility, ShapesReward, MeanPixel])
def test_bad_uint8_input_is_refused_naming_the_reward(reward_class) -> None:
    reward = reward_class()
    name = reward.name
    pixels = random_pixels(2, 8, seed=5)
    with pytest.raises(
        RewardInputError, match=f"reward '{name}': score_uint8 takes uint8 pixels.*dtype torch.float32"
    ):
        reward.score_uint8(from_uint8(pixels), ["a", "b"])
    with pytest.raises(RewardInputError, match=f"reward '{name}'.*got a ndarray"):
        reward.score_uint8(pixels.numpy(), ["a", "b"])
    with pytest.raises(RewardInputError, match=f"reward '{name}'.*got shape \\(2, 4, 8, 8\\)"):
        reward.score_uint8(torch.zeros(2, 4, 8, 8, dtype=torch.uint8), ["a", "b"])
    with pytest.raises(RewardInputError, match=f"reward '{name}'.*channels last"):
        reward.score_uint8(pixels.permute(0, 2, 3, 1), ["a", "b"])
    with pytest.raises(RewardInputError, match=f"reward '{name}' got 2 images but 3 prompts"):
        reward.score_uint8(pixels, ["a", "b", "c"])
    with pytest.raises(RewardInputError, match=f"reward '{name}' got 2 images but metadata 1"):
        reward.score_uint8(pixels, ["a", "b"], [{}])
