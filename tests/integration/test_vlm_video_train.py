"""Issue 18's "Done when", in-process half: a tiny video DiffusionNFT iteration trains on `dance_grpo` (a tiny
random VideoReward in VideoAlign's layout), whole clips scored by the VLM reward; rewards logged under its keys."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sanarl import api
from sanarl.methods.config_loading import load_config
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("torchvision")

ROOT = Path(__file__).resolve().parents[2]
SHAPES = "sanarl.datasets.shapes"
TINY_STEPS = [
    "train.max_num_steps=1",
    "train.train_batch_per_replica=4",
    "train.train_policy.mini_batch=2",
    "train.ckpt.enable_checkpoint=false",
    "rollout.n_generation=4",
    "rollout.batch_size=4",
    "policy.diffusers.sample.num_steps=2",
    "validation.enable=false",
]


def dance_grpo_preset(directory: Path, options: str) -> Path:
    """presets/tiny-video-nft.toml with its `motion` reward replaced by `dance_grpo` (score key overall_reward)."""
    text = (ROOT / "sanarl" / "presets" / "tiny-video-nft.toml").read_text()
    motion = (
        '[[train.train_policy.remote_reward.reward_fns]]\nname = "motion"\nweight = 1.0\n'
        'score_key = "direction_exact"\n'
    )
    assert motion in text
    dance = (
        '[[train.train_policy.remote_reward.reward_fns]]\nname = "dance_grpo"\nweight = 1.0\n'
        f'score_key = "overall_reward"\n{options}'
    )
    path = directory / "tiny-video-nft-dance-grpo.toml"
    path.write_text(text.replace(motion, dance))
    return path


def test_tiny_video_nft_trains_on_dance_grpo_in_process(tmp_path):
    from sanarl.rewards.scorers.vlm.tiny import ensure_tiny_videoalign

    model = ensure_tiny_videoalign()
    preset = dance_grpo_preset(tmp_path, f'options = {{ model = "{model}", batch_size = 4 }}\n')
    config = load_config(preset, [f"train.output_dir={tmp_path / 'run'}", *TINY_STEPS])
    api.train(config, SHAPES)
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records] == [1]
    record = records[0]
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0
    assert math.isfinite(record["reward/dance_grpo"]) and "reward/dance_grpo/vq_reward" in record


def test_missing_reward_weights_stop_the_run_before_any_rollout(tmp_path, network):
    from sanarl.errors import WeightsError

    preset = dance_grpo_preset(tmp_path, "")
    config = load_config(preset, [f"train.output_dir={tmp_path / 'run'}", *TINY_STEPS])
    with pytest.raises(WeightsError, match="hf download KwaiVGI/VideoReward"):
        api.train(config, SHAPES)
    assert not (tmp_path / "run" / "rollouts").exists()
