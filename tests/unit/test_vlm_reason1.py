"""`cosmos_reason1` on a tiny random Qwen2.5-VL: Cosmos-RL's frame sampling and token budget by hand-derived
numbers, the Yes / No softmax, last-token logits against the model's own forward, batch = one by one, options."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("torchvision")

from sanarl.errors import ConfigError, WeightsError  # noqa: E402
from sanarl.rewards import build_reward  # noqa: E402
from sanarl.rewards.scorers.vlm import qwen, reason1, tiny  # noqa: E402

PROMPTS = ["a red circle moves left", "a blue square", "x"]


@pytest.fixture(scope="module")
def reward():
    r = build_reward("cosmos_reason1", model=str(tiny.ensure_tiny_qwen_vl("qwen2_5_vl")), batch_size=2)
    r.setup("cpu")
    return r


def clips(batch: int = 3, frames: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, frames, 16, 16, generator=torch.Generator().manual_seed(seed))


def test_frame_sampling_keeps_at_most_160_frames_an_even_count_and_scales_the_fps():
    assert reason1.sample_frames(41, 16.0) == (list(range(40)), 16.0)  # interval 40 // 160 + 1 = 1; 41 -> 40
    indices, fps = reason1.sample_frames(
        321, 24.0
    )  # interval 320 // 160 + 1 = 3: 0, 3, ..., 320 = 107 -> 106
    assert indices == list(range(0, 318, 3)) and fps == 8.0
    assert reason1.sample_frames(161, 16.0)[0] == list(range(0, 160, 2))  # interval 2: 81 frames -> 80


def test_frame_size_spreads_a_9216_token_budget_over_the_frames():
    # 40 frames of 480x832: per frame 9216 * 784 * 2 // 40 = 361267; 476 x 840 = 399840 is over it:
    # beta = sqrt(399360 / 361267) = 1.05140 -> 480 / beta = 456.5 -> 448, 832 / beta = 791.3 -> 784.
    assert reason1.frame_size(480, 832, 40) == (448, 784)
    # 16x16 grows to min_pixels 16 * 784 * 2 = 25088: beta = sqrt(98) = 9.899, 16 * beta / 28 = 5.66 -> 6 -> 168.
    assert reason1.frame_size(16, 16, 8) == (168, 168)


def test_yes_no_softmax_and_prediction():
    got = reason1.yes_no_scores(torch.tensor([1.0, 2.0, 0.5]), torch.tensor([3.0, -1.0, 0.5]))
    assert got["no_score"].tolist() == pytest.approx([1 / (1 + math.exp(-2)), 1 / (1 + math.exp(3)), 0.5])
    assert got["good"].tolist() == [1.0, 0.0, 1.0]  # Cosmos-RL: "Bad" only when yes_logit > no_logit


def test_clip_inputs_follow_the_protocol(reward):
    frames, fps = reward.clip_inputs(clips(1)[0], {"video_info": {"video_fps": 8.0}})
    assert tuple(frames.shape) == (8, 3, 168, 168) and fps == 8.0  # 9 frames -> 8, sized as above
    assert frames.min() >= 0 and frames.max() <= 255 and torch.equal(frames, frames.round())


def test_scores_are_the_models_own_last_token_logits_and_batch_equals_one_by_one(reward):
    x = clips()
    batch = reward.score(x, PROMPTS)
    for i, prompt in enumerate(PROMPTS):
        frames, fps = reward.clip_inputs(x[i], {})
        inputs = qwen.encode(reward.processor, reward.texts([prompt]), [frames])
        inputs["second_per_grid_ts"] = torch.tensor([2 / fps])
        logits = reward.model(**inputs).logits[0, -1]  # Cosmos-RL: one clip, no padding, the last position
        yes, no = float(logits[reward.yes_id]), float(logits[reward.no_id])
        assert float(batch["yes_logit"][i]) == pytest.approx(yes, abs=1e-4)
        assert float(batch["no_score"][i]) == pytest.approx(
            math.exp(no) / (math.exp(yes) + math.exp(no)), abs=1e-5
        )
    single = torch.cat([reward.score(x[i : i + 1], [p])["no_score"] for i, p in enumerate(PROMPTS)])
    assert torch.allclose(batch["no_score"], single, atol=1e-5)


def test_ask_question_sends_the_model_cards_question(reward):
    text = reward.texts(["a cat"])[0]
    assert reason1.SYSTEM_PROMPT in text and "a cat" in text
    question = build_reward("cosmos_reason1", ask="question")
    question.processor = reward.processor
    asked = question.texts(["a cat"])[0]
    assert reason1.QUESTION in asked and "a cat" not in asked


def test_options_and_missing_weights(network):
    with pytest.raises(ConfigError, match="ask"):
        build_reward("cosmos_reason1", ask="why")
    with pytest.raises(ConfigError, match="video_fps"):
        build_reward("cosmos_reason1", video_fps=0)
    with pytest.raises(WeightsError, match="hf download nvidia/Cosmos-Reason1-7B-Reward") as info:
        build_reward("cosmos_reason1").setup("cpu")
    assert info.value.exit_code == 2
