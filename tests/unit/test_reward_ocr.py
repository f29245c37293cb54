"""The `ocr` reward: Levenshtein math by hand, target parsing, and the real RapidOCR engine reading PIL-rendered text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from sanarl.errors import ConfigError
from sanarl.rewards import build_reward, known_rewards
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.scorers.ocr import OCRReward, levenshtein, normalise, ocr_score, target_of

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


# ---------------------------------------------------------------- math by hand


def test_levenshtein_by_hand() -> None:
    assert levenshtein("kitten", "sitting") == 3  # k->s, e->i, +g
    assert levenshtein("", "abc") == levenshtein("abc", "") == 3
    assert levenshtein("flaw", "lawn") == 2  # -f, +n
    assert levenshtein("same", "same") == 0
    assert levenshtein("ab", "ba") == 2  # no transpositions in plain Levenshtein


def test_score_normalises_caps_and_rewards_substrings() -> None:
    assert normalise(" Eat  Here\n") == "eathere"
    assert ocr_score("EAT HERE", "Eat Here") == 1.0
    assert ocr_score("eat her", "Eat Here") == pytest.approx(1 - 1 / 7)  # one deletion, target "eathere" (7)
    assert ocr_score("welcome! eat here today", "Eat Here") == 1.0  # substring: distance 0
    assert ocr_score("", "open") == 0.0  # d = 4 = len
    assert ocr_score("completely unrelated words", "open") == 0.0  # d > len, capped at len
    assert ocr_score("opne", "open") == pytest.approx(1 - 2 / 4)


def test_target_from_prompt_or_metadata() -> None:
    assert target_of('a sign saying "Eat Here" in "red"', {}) == "Eat Here"  # the first span
    assert target_of("no quotes here", {"target": "Hi"}) == "Hi"  # the prompt set's own target wins
    with pytest.raises(RewardInputError, match="prompt 'a plain sign' has none"):
        target_of("a plain sign", {})
    with pytest.raises(RewardInputError, match="double quotes"):
        target_of('a sign "x"', {"target": None})  # the ocr prompt set marks prompts without a span with None
    with pytest.raises(RewardInputError):
        target_of('an empty "  " span', {})


# ---------------------------------------------------------------- the real engine


def render(text: str, size: tuple[int, int] = (320, 96), font_size: int = 40) -> np.ndarray:
    """Black text on white, centred (uint8 [H, W, 3])."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype(str(FONT), font_size)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    xy = ((size[0] - (right - left)) // 2 - left, (size[1] - (bottom - top)) // 2 - top)
    draw.text(xy, text, fill="black", font=font)
    return np.asarray(image)


def as_batch(*arrays: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0


@pytest.fixture(scope="module")
def reward():
    if not FONT.is_file():
        pytest.skip("DejaVuSans.ttf not installed (apt-get install fonts-dejavu-core)")
    pytest.importorskip("rapidocr_onnxruntime")
    return OCRReward(threads=1, det_limit_type="max", det_limit_side_len=320)  # no upscaling: fast


def test_engine_reads_rendered_text_and_scores_targets(reward) -> None:
    images = as_batch(render("Hello World"), render("Hello World"), render("OPEN 24"))
    prompts = ['a sign saying "hello world"', 'a sign saying "goodbye moon"', 'a neon sign "Open 24"']
    scores = reward.score(images, prompts)["ocr"]
    assert normalise(reward.read(render("Hello World"))) == "helloworld"
    assert scores[0].item() == 1.0 and scores[2].item() == 1.0
    expected_wrong = 1 - min(levenshtein("helloworld", "goodbyemoon"), 11) / 11
    assert scores[1].item() == pytest.approx(expected_wrong) and scores[1].item() < 0.5


def test_blank_image_scores_zero_and_batching_is_invariant(reward) -> None:
    blank = np.full((96, 320, 3), 255, np.uint8)
    images = as_batch(render("Cafe"), blank, render("Books"))
    prompts = ['"cafe" sign', '"cafe" sign', 'a shop called "Books"']
    together = reward.score(images, prompts)["ocr"]
    alone = [reward.score(images[i : i + 1], prompts[i : i + 1])["ocr"].item() for i in range(3)]
    assert together.tolist() == alone == [1.0, 0.0, 1.0]
    assert together.dtype == torch.float32 and torch.equal(reward.score(images, prompts)["ocr"], together)


def test_prompt_without_quotes_is_a_reward_input_error(reward) -> None:
    with pytest.raises(RewardInputError, match="'a red apple'"):
        reward.score(as_batch(render("x")), ["a red apple"])


def test_registered_and_options_checked() -> None:
    assert "ocr" in known_rewards()
    assert isinstance(build_reward("ocr", threads=1), OCRReward)
    with pytest.raises(ConfigError, match="threads=0"):
        build_reward("ocr", threads=0)
    with pytest.raises(ConfigError, match="text_score=2"):
        build_reward("ocr", text_score=2)


def test_uint8_pixels_score_as_their_floats(reward) -> None:
    """`score_uint8` (the reward service's call) reads the pixels as received: equal to `score` of `x / 255`."""
    rng = np.random.default_rng(0)
    noisy = np.clip(render("Hello World").astype(np.int16) + rng.integers(-20, 21, (96, 320, 3)), 0, 255)
    arrays = np.stack(
        [noisy.astype(np.uint8), render("OPEN 24"), rng.integers(0, 256, (96, 320, 3), np.uint8)]
    )
    pixels = torch.from_numpy(arrays).permute(0, 3, 1, 2)  # a view of [B, H, W, 3], as the worker passes it
    prompts = ['a sign saying "hello world"', 'a neon sign "Open 25"', 'a sign saying "noise"']
    direct = reward.score_uint8(pixels, prompts)["ocr"]
    assert torch.equal(direct, reward.score(pixels.float() / 255.0, prompts)["ocr"])
    assert direct[0].item() == 1.0 and direct[1].item() == pytest.approx(1 - 1 / 6)
