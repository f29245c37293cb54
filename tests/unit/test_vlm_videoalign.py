"""`dance_grpo` / `videoalign` (VideoAlign's VideoReward) on a tiny random checkpoint in VideoAlign's own layout:
qwen-vl-utils' frame and pixel arithmetic by hand-derived numbers, the prompt, the reward head, normalisation, the
LoRA merge, batch = one by one, whole-clip scoring, options and missing weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("torchvision")

from sanarl.errors import ConfigError, WeightsError  # noqa: E402
from sanarl.rewards import RewardInputError, build_reward  # noqa: E402
from sanarl.rewards.scorers.vlm import tiny, videoalign, vision  # noqa: E402

PROMPTS = ["a red circle moves left", "a blue square moves up", "a green triangle"]


@pytest.fixture(scope="module")
def reward_dir():
    return tiny.ensure_tiny_videoalign()


@pytest.fixture(scope="module")
def reward(reward_dir):
    r = build_reward("dance_grpo", model=str(reward_dir), batch_size=2)
    r.setup("cpu")
    return r


def clips(batch: int = 3, frames: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, frames, 16, 16, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- arithmetic, by hand


def test_smart_resize_grows_small_frames_to_min_pixels_and_shrinks_large_ones_to_the_budget():
    # 16x16, min 100352: beta = sqrt(100352 / 256) = 19.799; 16 * 19.799 / 28 = 11.31 -> ceil 12 -> 336.
    assert vision.smart_resize(16, 16, min_pixels=100352, max_pixels=200704) == (336, 336)
    # 480x832 rounds to 476x840 = 399840 > 200704: beta = sqrt(399360 / 200704) = 1.41060;
    # 480 / beta = 340.28 -> floor to 28: 336; 832 / beta = 589.82 -> 588.
    assert vision.smart_resize(480, 832, min_pixels=100352, max_pixels=200704) == (336, 588)
    # within the budget: each side to its nearest multiple of 28 (300 -> 308, 400 -> 392).
    assert vision.smart_resize(300, 400, min_pixels=3136, max_pixels=10**6) == (308, 392)
    with pytest.raises(RewardInputError, match="aspect ratio"):
        vision.smart_resize(1, 201)


def test_smart_nframes_and_uniform_indices():
    # 41 frames at 16 fps, 2 fps wanted: 41 / 16 * 2 = 5.125 in [4, 40] -> round(2.5625) * 2 = 6.
    assert vision.smart_nframes(41, 16.0, fps=2.0) == 6
    assert vision.uniform_indices(41, 6) == [0, 8, 16, 24, 32, 40]
    # 8 frames at 16 fps: 1 frame wanted -> at least 4; linspace(0, 7, 4) = 0, 2.33, 4.67, 7.
    assert vision.smart_nframes(8, 16.0, fps=2.0) == 4
    assert vision.uniform_indices(8, 4) == [0, 2, 5, 7]
    # torch rounds halves to even: linspace(0, 5, 3) = 0, 2.5, 5 -> 0, 2, 5; nframes 5 -> round(2.5) * 2 = 4.
    assert vision.uniform_indices(6, 3) == [0, 2, 5]
    assert vision.smart_nframes(6, 16.0, nframes=5) == 4
    assert vision.smart_nframes(3, 16.0, nframes=8) == 3  # capped at the clip length
    # 200 frames at 8 fps: 50 -> floor2(min(768, 200)) = 200 bounds it no further.
    assert vision.smart_nframes(200, 8.0, fps=2.0) == 50
    with pytest.raises(RewardInputError, match="at least 2 frames"):
        vision.smart_nframes(1, 16.0)
    # the per-frame budget without max_pixels: min(602112, 19267584 / 6 * 2) = 602112.
    assert vision.video_max_pixels(6) == 768 * 28 * 28
    assert vision.video_max_pixels(100) == 385351  # 19267584 / 100 * 2 = 385351.68
    assert vision.video_max_pixels(1000) == 105369  # 38535.7 < int(1.05 * 100352): the floor wins


def test_prompt_is_videoaligns_detailed_special_template_with_the_caption():
    text = videoalign.build_prompt("a cat surfing", "detailed_special")
    assert text.startswith(
        "\nYou are tasked with evaluating a generated video based on three distinct criteria"
    )
    assert text.endswith("Please provide the ratings of Text Alignment: <|TA_reward|>\nEND\n")
    assert "Textual prompt - a cat surfing\n" in text
    assert [text.count(t) for t in videoalign.SPECIAL_TOKENS] == [1, 1, 1]
    assert videoalign.build_prompt("a cat", "none") == "a cat"


def test_pool_scores_reads_the_head_at_the_special_tokens_the_last_token_or_the_mean():
    ids = torch.tensor([[5, 7, 9, 8, 0, 0], [7, 5, 8, 5, 9, 1]])  # reward tokens 7, 8, 9; pad 0
    logits = torch.arange(12, dtype=torch.float32).view(2, 6, 1) * 10
    got = videoalign.pool_scores(logits, ids, "special", [7, 8, 9], 0)
    # sample 0: tokens 7, 9, 8 at positions 1, 2, 3 (read in sequence order); sample 1: positions 0, 2, 4.
    assert got.tolist() == [[10.0, 20.0, 30.0], [60.0, 80.0, 100.0]]
    three = torch.arange(36, dtype=torch.float32).view(2, 6, 3)
    diag = videoalign.pool_scores(three, ids, "special", [7, 8, 9], 0)
    # head i at the i-th reward token: rows 1, 2, 3 of sample 0 (values 3k..3k+2), rows 0, 2, 4 of sample 1.
    assert diag.tolist() == [[3.0, 7.0, 11.0], [18.0, 25.0, 32.0]]
    last = videoalign.pool_scores(three, ids, "last", [], 0)
    # sample 0: first pad at 4 -> last real token 3; sample 1 has no pad -> (0 - 1) % 6 = 5.
    assert last.tolist() == [three[0, 3].tolist(), three[1, 5].tolist()]
    mean = videoalign.pool_scores(three, ids, "mean", [], 0)
    assert torch.allclose(mean[0], three[0, :3].mean(0)) and torch.allclose(mean[1], three[1, :5].mean(0))
    with pytest.raises(RewardInputError, match="exactly once"):
        videoalign.pool_scores(logits[:1], torch.tensor([[7, 7, 8, 9, 0, 0]]), "special", [7, 8, 9], 0)


def test_normalise_uses_the_checkpoints_means_and_stds():
    raw = torch.tensor([[1.5, 0.25, 8.0]])
    got = videoalign.normalise(raw, tiny.TINY_NORM)
    assert got.tolist() == [[(1.5 - 0.5) / 2.0, (0.25 + 0.25) / 0.5, 8.0 / 4.0]]
    assert videoalign.normalise(raw, None) is raw


# ---------------------------------------------------------------- checkpoint loading


def test_lora_checkpoint_is_merged_as_w_plus_alpha_over_r_b_a(reward, reward_dir):
    from safetensors.torch import load_file
    from transformers import Qwen2VLForConditionalGeneration

    config = json.loads((reward_dir / "model_config.json").read_text())
    base = Qwen2VLForConditionalGeneration.from_pretrained(config["model_config"]["model_name_or_path"])
    adapter = load_file(str(reward_dir / "checkpoint-1" / "adapter_model.safetensors"))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    a, b = adapter[f"{prefix}.lora_A.weight"], adapter[f"{prefix}.lora_B.weight"]
    expected = base.model.language_model.layers[0].self_attn.q_proj.weight + (8 / 4) * b @ a
    merged = reward.net.vlm.model.language_model.layers[0].self_attn.q_proj.weight
    assert torch.allclose(merged, expected, atol=1e-6)
    rest = torch.load(reward_dir / "checkpoint-1" / "non_lora_state_dict.pth", weights_only=True)
    assert torch.equal(reward.net.rm_head.weight, rest["base_model.model.rm_head.weight"])
    assert torch.equal(
        reward.net.vlm.model.language_model.embed_tokens.weight,
        rest["base_model.model.model.embed_tokens.weight"],
    )
    assert len(reward.processor.tokenizer) == rest["base_model.model.model.embed_tokens.weight"].shape[0]


def test_model_config_settings_it_cannot_reproduce_are_refused(tmp_path, reward_dir):
    raw = json.loads((reward_dir / "model_config.json").read_text())
    raw["data_config"]["sample_type"] = "multi_pts"
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(WeightsError, match="sample_type = 'multi_pts'"):
        videoalign.VideoAlignConfig.read(path)


# ---------------------------------------------------------------- scoring


def test_scores_have_cosmos_rl_and_videoalign_keys_and_overall_is_the_sum(reward):
    out = reward.score(clips(), PROMPTS)
    assert set(out) == {"overall_reward", "vq_reward", "mq_reward", "ta_reward", "VQ", "MQ", "TA"}
    assert torch.allclose(out["overall_reward"], out["vq_reward"] + out["mq_reward"] + out["ta_reward"])
    assert torch.equal(out["VQ"], out["vq_reward"]) and torch.equal(out["TA"], out["ta_reward"])
    assert all(torch.isfinite(v).all() and v.shape == (3,) for v in out.values())
    assert reward.default_key == "overall_reward"


def test_normalised_scores_are_raw_head_outputs_standardised(reward_dir, reward):
    raw = build_reward("dance_grpo", model=str(reward_dir), use_norm=False).score(clips(), PROMPTS)
    norm = reward.score(clips(), PROMPTS)
    for head in ("VQ", "MQ", "TA"):
        mean, std = tiny.TINY_NORM[f"{head}_mean"], tiny.TINY_NORM[f"{head}_std"]
        assert torch.allclose(norm[head], (raw[head] - mean) / std, atol=1e-5)


def test_batch_equals_one_by_one(reward):
    batch = reward.score(clips(), PROMPTS)["overall_reward"]
    single = torch.cat(
        [reward.score(clips()[i : i + 1], [p])["overall_reward"] for i, p in enumerate(PROMPTS)]
    )
    assert torch.allclose(batch, single, atol=1e-4)


def test_clips_are_scored_whole_from_the_sampled_frames_only(reward):
    # 8 frames at 16 fps -> frames 0, 2, 5, 7 are what the model sees (see the arithmetic test).
    base = clips(batch=1)
    unsampled, sampled = base.clone(), base.clone()
    unsampled[:, :, 1] = 1.0 - unsampled[:, :, 1]
    sampled[:, :, 2] = 1.0 - sampled[:, :, 2]
    score = reward.score(base, PROMPTS[:1])["overall_reward"]
    assert torch.equal(reward.score(unsampled, PROMPTS[:1])["overall_reward"], score)
    assert not torch.allclose(reward.score(sampled, PROMPTS[:1])["overall_reward"], score)
    frames = reward.frames_for(base[0], {})
    assert tuple(frames.shape) == (4, 3, 336, 336)
    # a clip's own frame rate comes from its metadata: 8 frames at 4 fps -> 4 frames wanted, still 4.
    assert tuple(reward.frames_for(base[0], {"video_info": {"video_fps": 4.0}}).shape) == (4, 3, 336, 336)
    assert tuple(reward.frames_for(torch.rand(3, 40, 16, 16), {"video_fps": 8.0}).shape)[0] == 10


def test_frames_are_resized_from_uint8_like_a_decoded_video(reward):
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import resize

    clip = clips(batch=1)[0]
    uint8 = (clip * 255).round().to(torch.uint8).permute(1, 0, 2, 3)[[0, 2, 5, 7]]
    expected = resize(uint8, [336, 336], interpolation=InterpolationMode.BICUBIC, antialias=True).float()
    assert torch.equal(reward.frames_for(clip, {}), expected)


def test_images_are_refused_with_a_message(reward):
    with pytest.raises(RewardInputError, match=r"\[B, C, T, H, W\]"):
        reward.score(torch.rand(2, 3, 16, 16), PROMPTS[:2])


# ---------------------------------------------------------------- options and weights


def test_options_are_validated():
    with pytest.raises(ConfigError, match="at most one of the options fps and num_frames"):
        build_reward("dance_grpo", fps=2.0, num_frames=8)
    with pytest.raises(ConfigError, match="batch_size"):
        build_reward("dance_grpo", batch_size=0)
    with pytest.raises(ConfigError, match="video_fps"):
        build_reward("dance_grpo", video_fps=-1)
    with pytest.raises(ConfigError, match="dtype"):
        build_reward("dance_grpo", dtype="int8")
    with pytest.raises(ConfigError, match="does not accept the options"):
        build_reward("dance_grpo", frames=3)


def test_missing_weights_stop_with_exit_code_2_naming_the_id_and_how_to_get_it(network):
    reward = build_reward("dance_grpo")
    with pytest.raises(WeightsError) as info:
        reward.setup("cpu")
    message = str(info.value)
    assert "KwaiVGI/VideoReward" in message and "hf download KwaiVGI/VideoReward" in message
    assert "model=" in message and info.value.exit_code == 2


def test_missing_base_model_names_cosmos_rls_download_path(tmp_path, reward_dir, network):
    reward = build_reward("dance_grpo", model=str(reward_dir), download_path=str(tmp_path))
    with pytest.raises(WeightsError, match="Qwen2-VL-2B-Instruct"):
        reward.setup("cpu")


def test_alias_videoalign_scores_the_same(reward_dir, reward):
    alias = build_reward("videoalign", model=str(reward_dir))
    assert alias.name == "videoalign"
    assert torch.allclose(
        alias.score(clips(1), PROMPTS[:1])["overall_reward"],
        reward.score(clips(1), PROMPTS[:1])["overall_reward"],
    )


def test_dtype_auto_is_float32_on_cpu(reward):
    assert next(reward.net.parameters()).dtype == torch.float32
    assert math.isclose(
        float(reward.score(clips(1), PROMPTS[:1])["VQ"]), float(reward.score(clips(1), PROMPTS[:1])["VQ"])
    )


def test_forward_uses_sequential_positions_like_videoaligns_transformers_4_forward(reward):
    """VideoAlign's forward runs the language model with position_ids=None (sequential 0..L-1 on all three M-RoPE
    axes), not the multimodal rope index; the oracle is the language model called that way on the scattered
    embeddings, and the full multimodal forward gives other numbers."""
    from sanarl.rewards.scorers.vlm import qwen

    clip = clips(1)[0]
    batch = qwen.encode(reward.processor, reward.texts(PROMPTS[:1]), [reward.frames_for(clip, {})])
    inner = reward.net.vlm.model
    embeds = inner.get_input_embeddings()(batch["input_ids"])
    video = inner.get_video_features(batch["pixel_values_videos"], batch["video_grid_thw"])
    video = torch.cat(list(getattr(video, "pooler_output", video)))
    mask = (batch["input_ids"] == reward.net.vlm.config.video_token_id).unsqueeze(-1).expand_as(embeds)
    embeds = embeds.masked_scatter(mask, video)
    oracle = inner.language_model(
        inputs_embeds=embeds, attention_mask=batch["attention_mask"]
    ).last_hidden_state
    got = qwen.sequential_hidden_states(reward.net.vlm, batch)
    assert torch.allclose(got, oracle, atol=1e-5)
    mrope = inner(**batch).last_hidden_state
    assert not torch.allclose(got, mrope, atol=1e-3)


def test_sana_video_preset_reward_is_a_registered_sanarl_reward():
    """presets/sana-video-nft.toml trains on `dance_grpo` / `overall_reward`: sanarl's registry has it (validate reads
    the registry), with that score key."""
    from pathlib import Path

    from sanarl.methods.config_loading import load_config
    from sanarl.rewards import known_rewards

    preset = Path(__file__).resolve().parents[2] / "sanarl" / "presets" / "sana-video-nft.toml"
    fns = load_config(preset).config.train.train_policy.remote_reward.reward_fns
    assert [(f.name, f.score_key) for f in fns] == [("dance_grpo", "overall_reward")]
    assert {"dance_grpo", "videoalign", "cosmos_reason1", "hpsv3", "unified_reward"} <= set(known_rewards())
    reward = build_reward("dance_grpo")
    assert isinstance(reward, videoalign.VideoAlign) and "overall_reward" in reward.keys


def test_split_lora_pairs_peft_keys_in_both_layouts():
    a, b, w = torch.ones(2, 4), torch.full((3, 2), 2.0), torch.zeros(3, 4)
    raw = {
        "base_model.model.model.layers.0.mlp.up_proj.base_layer.weight": w,
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight": a,  # model.pth of a PEFT model
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight": b,
        "base_model.model.visual.blocks.0.attn.qkv.lora_A.weight": a,  # adapter_model.safetensors
        "base_model.model.visual.blocks.0.attn.qkv.lora_B.weight": b,
        "base_model.model.rm_head.weight": torch.ones(1, 4),
    }
    plain, pairs = videoalign.split_lora(raw)
    assert set(plain) == {"model.language_model.layers.0.mlp.up_proj.weight", "rm_head.weight"}
    assert set(pairs) == {
        "model.language_model.layers.0.mlp.up_proj.weight",
        "model.visual.blocks.0.attn.qkv.weight",
    }
    assert all(p[0] is a and p[1] is b for p in pairs.values())
    with pytest.raises(WeightsError, match="partner"):
        videoalign.split_lora({"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": a})


def test_missing_extra_is_a_config_error_naming_the_install_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if `sanarl[vlm]` were not installed
    for name in ("dance_grpo", "cosmos_reason1", "hpsv3", "unified_reward"):
        with pytest.raises(ConfigError, match=r"pip install 'sanarl\[vlm\]'"):
            build_reward(name).check_weights()
