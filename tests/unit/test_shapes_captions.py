"""The shapes judges read captions of their own grammar (sanarl/worlds/shapes/captions.py): parsed rows equal the
worlds' rows, parsed prompts are judged like prompts with metadata, and the rest is refused naming the grammar,
before any model loads (`sanarl.rewards.reward_checks`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sanarl.errors import DataError
from sanarl.methods.config_loading import load_config
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.reward_checks import check_items, check_reward_prompts
from sanarl.rewards.scorers.motion import MotionReward
from sanarl.rewards.scorers.shapes import ShapesReward
from sanarl.worlds import moving_shapes
from sanarl.worlds import shapes as shapes_world
from sanarl.worlds.shapes.captions import parse_caption, parse_motion_caption


def _images(rows: list[dict], size: int = 32) -> torch.Tensor:
    arrays = [shapes_world.render(row, size, seed=i) for i, row in enumerate(rows)]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0


def test_every_world_caption_parses_back_to_its_row():
    rows = [
        row for split in ("train", "test") for tag in shapes_world.list_prompts(split).values() for row in tag
    ]
    assert len(rows) > 500
    assert all(parse_caption(row["prompt"]) == row for row in rows)
    for split in ("train", "test"):
        for combo in moving_shapes.combinations(split):
            row = moving_shapes.metadata_row(*combo)
            assert parse_motion_caption(row["prompt"]) == row


def test_captions_outside_the_generated_set_state_their_row():
    assert parse_caption("Two red squares.") == {
        "tag": "counting",
        "include": [{"class": "square", "count": 2, "color": "red"}],
        "exclude": [{"class": "square", "count": 3}],
        "prompt": "Two red squares.",
    }
    assert parse_caption("a blue circle to the left of a yellow square")["include"] == [
        {"class": "square", "count": 1, "color": "yellow"},
        {"class": "circle", "count": 1, "color": "blue", "position": ["left of", 0]},
    ]
    three = parse_caption("three green triangles and a circle")
    assert three["tag"] == "color_attr"
    assert three["exclude"] == [{"class": "triangle", "count": 4}]
    assert parse_motion_caption("one square moving up")["motion"] == "up"


@pytest.mark.parametrize(
    "caption",
    [
        "a cat on a sofa",
        "a squares",  # number and plural disagree
        "two square",
        "two red squares above a circle",  # relations hold between single objects
        "a purple circle",
        "a red circle moving left",  # a motion caption is not an image caption
        "",
    ],
)
def test_captions_outside_the_grammar_do_not_parse(caption):
    assert parse_caption(caption) is None


def test_a_parsed_prompt_is_judged_like_one_with_metadata():
    rows = [parse_caption(c) for c in ("two red squares", "a blue circle to the left of a yellow square")]
    images = _images(rows)
    from_parse = ShapesReward().score(images, [r["prompt"] for r in rows], [{}, {}])
    from_rows = ShapesReward().score(images, [r["prompt"] for r in rows], rows)
    assert from_parse["strict"].tolist() == from_rows["strict"].tolist() == [1.0, 1.0]
    mirrored = _images([parse_caption("a blue circle to the right of a yellow square")])
    wrong = ShapesReward().score(mirrored, ["a blue circle to the left of a yellow square"], [{}])
    assert wrong["strict"].tolist() == [0.0] and 0 < wrong["partial"].item() < 1


def test_motion_judges_a_caption_without_metadata():
    row, seed = moving_shapes.sample_item("train", 0, 0)
    clip = (
        torch.from_numpy(moving_shapes.render_clip(row, 16, 8, seed)).permute(3, 0, 1, 2)[None].float()
        / 255.0
    )
    ok = MotionReward().score(clip, [row["prompt"]], [{}])
    flipped = {"left": "right", "right": "left", "up": "down", "down": "up"}[row["motion"]]
    reverse = MotionReward().score(clip, [row["prompt"].replace(row["motion"], flipped)], [{}])
    assert ok["direction"].item() > 0.9 and reverse["direction"].item() < 0.1


def test_refusals_name_the_first_prompt_and_the_grammar():
    items = [{"prompt": "a red circle"}, {"prompt": "a cat on a sofa"}, {"prompt": "a dog"}]
    with pytest.raises(RewardInputError, match=r"my data, item 1: reward 'shapes': prompt 'a cat on a sofa'.*"
                       r"shapes grammar: '\[a\|one\|two\|three\|four\] \[colour\] shape\[s\]'"):  # fmt: skip
        check_items([ShapesReward()], items, "my data")
    with pytest.raises(RewardInputError, match="prompt 'a red circle'.*motion grammar.*moving left"):
        check_items([MotionReward()], items, "my data")


class _Plugin:
    def __init__(self, prompts: list[str]) -> None:
        self.items = [{"prompt": p, "metadata": {}} for p in prompts]

    def get_dataset(self, config):
        return self.items


def test_the_preflight_reads_the_data_only_for_rewards_that_check_prompts():
    cfg = load_config("tiny-shapes-nft").config
    check_reward_prompts(cfg, _Plugin(["two red squares", "a green triangle"]))
    with pytest.raises(DataError, match="training data, item 1: .*'a cat'"):
        check_reward_prompts(cfg, _Plugin(["two red squares", "a cat"]))
    sft = load_config("tiny-shapes-sft").config  # no reward, no held-out reward: the data is never read
    check_reward_prompts(sft, object())
