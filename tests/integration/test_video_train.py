"""Tiny video SFT and DiffusionNFT end to end on CPU through `sanarl.api.train` (the shipped tiny-video presets,
shrunk): losses finite, weights move, samples and rollouts saved as mp4, exports load in diffusers.

Needs the runner to save 5-D validation samples with `save_media` and `RewardFunction` to pass clips to
video-native rewards (docs/video.md, "Integration")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.core import media
from sanarl.methods.config_loading import load_config
from sanarl.training.tracking import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
pytest.importorskip("av")

ROOT = Path(__file__).resolve().parents[2]
SHAPES = "sanarl.datasets.shapes"
SMALL = [
    "train.train_batch_per_replica=4",
    "train.train_policy.mini_batch=2",
    "train.ckpt.save_freq=100",
    "validation.num_samples=2",
    "validation.batch_size=2",
    "validation.val_before_train=false",
    "policy.diffusers.sample.eval_num_steps=2",
]


def test_tiny_video_sft_trains_saves_mp4_samples_and_exports_a_diffusers_pipeline(tmp_path):
    from diffusers import SanaVideoPipeline

    import sanarl.models.tiny_video  # noqa: F401  (the pixel-space VAE class of the export)

    overrides = [f"train.output_dir={tmp_path}", "train.max_num_steps=2", "train.optm_warmup_steps=0", *SMALL]
    outcome = api.train(load_config(ROOT / "sanarl" / "presets" / "tiny-video-sft.toml", overrides), SHAPES)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in records)
    sample = tmp_path / "samples" / "step_00000002.mp4"
    assert media.probe_frames(sample) == 8  # inference_frames
    pipe = SanaVideoPipeline.from_pretrained(str(outcome.result.export_dir))
    fresh = SanaVideoPipeline.from_pretrained(str(api_tiny_dir("shapes-video")))
    moved = [
        not torch.equal(p, fresh.transformer.state_dict()[k])
        for k, p in pipe.transformer.state_dict().items()
    ]
    assert any(moved)  # the export holds the trained weights, not the initial ones


def api_tiny_dir(name: str) -> Path:
    from sanarl.models.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(name)


def test_tiny_video_nft_scores_clips_with_motion_and_exports_a_loadable_lora(tmp_path):
    """From the preset's shipped base (sanarl-tiny:video-base); validation scores held-out prompts with `motion`."""
    from diffusers import SanaVideoPipeline
    from safetensors.torch import load_file

    overrides = [
        f"train.output_dir={tmp_path}",
        "train.max_num_steps=2",
        "rollout.n_generation=4",
        "rollout.batch_size=4",
        "policy.diffusers.sample.num_steps=3",
        "logging.multi_modal_log_interval=1",
        *SMALL,
        "validation.val_before_train=true",
    ]
    config = load_config(ROOT / "sanarl" / "presets" / "tiny-video-nft.toml", overrides)
    assert config.config.policy.model_name_or_path == "sanarl-tiny:video-base"
    api.train(config, SHAPES)
    everything = read_metrics(tmp_path / "metrics.jsonl")
    held_out = [r for r in everything if "heldout/motion/direction" in r]
    assert [r["step"] for r in held_out] == [0, 2]  # before training and at the end
    for r in held_out:
        assert 0.0 <= r["heldout/motion/direction"] <= 1.0 and r["heldout/motion/visible"] > 0
    records = [r for r in everything if "loss" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
        assert 0.0 <= r["reward/mean"] <= 1.0 and "reward/motion/visible" in r
    rollout = media.read_video(tmp_path / "rollouts" / "step_00000000.mp4")
    assert rollout.shape[0] == 8
    lora = load_file(str(tmp_path / "export" / "pytorch_lora_weights.safetensors"))
    assert lora and all(torch.isfinite(v).all() for v in lora.values())
    pipe = SanaVideoPipeline.from_pretrained(str(api_tiny_dir("video-base")))
    torch.manual_seed(0)
    x, text = torch.randn(1, 3, 8, 16, 16), torch.randn(1, 4, 64)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return pipe.transformer(x, encoder_hidden_states=text, timestep=torch.tensor([500.0]))[0]

    before = forward()
    pipe.load_lora_weights(str(tmp_path / "export"))
    assert len(pipe.get_list_adapters()["transformer"]) == 1
    assert (forward() - before).abs().max().item() > 1e-7  # the trained adapter changes the model
