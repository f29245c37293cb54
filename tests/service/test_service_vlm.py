"""`dance_grpo` served by a real `sanarl-reward` (embedded redis-server, one worker) on a tiny random VideoReward:
whole clips scored as in-process, Cosmos-RL's video client protocol (`video_infos`, weights in `reward_fn`, form
pulls, Cosmos-RL's score keys), sanarl's trainer client, and missing weights stopping the service at start."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from service_helpers import TOKEN, Service, body, free_port, require_redis

from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards import RewardFunction, build_reward
from sanarl.rewards.remote import RemoteRewardFunction

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("torchvision")

PROMPTS = ["a red circle moves left", "a blue square moves up"]


@pytest.fixture(scope="module")
def videoreward():
    from sanarl.rewards.scorers.vlm.tiny import ensure_tiny_videoalign

    return ensure_tiny_videoalign()


@pytest.fixture(scope="module")
def tiny_dirs():
    from sanarl.rewards.scorers.vlm.tiny import ensure_tiny_hpsv3, ensure_tiny_qwen_vl

    return {
        "qwen2_vl": ensure_tiny_qwen_vl("qwen2_vl"),
        "qwen2_5_vl": ensure_tiny_qwen_vl("qwen2_5_vl"),
        "hpsv3": ensure_tiny_hpsv3(),
    }


@pytest.fixture(scope="module")
def service(tmp_path_factory, videoreward, tiny_dirs):
    require_redis()
    tmp = tmp_path_factory.mktemp("vlm-service")
    port = free_port()
    text = f"""
port = {port}
token = "{TOKEN}"
log_level = "warning"
[workers]
count = 1
torch_threads = 1
[[reward_args]]
reward_type = "dance_grpo"
model_path = "{videoreward}"
dtype = "float32"
options = {{ batch_size = 2 }}
[[reward_args]]
reward_type = "cosmos_reason1"
model_path = "{tiny_dirs["qwen2_5_vl"]}"
[[reward_args]]
reward_type = "hpsv3"
model_path = "{tiny_dirs["hpsv3"]}"
options = {{ base_model = "{tiny_dirs["qwen2_vl"]}" }}
[[reward_args]]
reward_type = "unified_reward"
model_path = "{tiny_dirs["qwen2_5_vl"]}"
options = {{ max_new_tokens = 4 }}
"""
    svc = Service(tmp, "vlm", text, port).start()
    try:
        svc.wait_healthy(timeout=180)
        yield svc
    finally:
        assert svc.stop() == 0


def uint8_clips(count: int, frames: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 3, frames, 16, 16), dtype=np.uint8)


def test_cosmos_rl_video_client_request_gets_cosmos_rl_keys_equal_to_in_process(service, videoreward):
    """The request Cosmos-RL's example/video_client.py sends (prompts, `{"dance_grpo": 1.0}`, video_infos with
    video_fps), with decoded uint8 clips `[B, 3, T, H, W]` in place of its latents; pulled with form fields."""
    clips = uint8_clips(2, frames=10)
    infos = [{"video_fps": 16.0}, {"video_fps": 8.0}]
    status, answer = service.enqueue(
        body(clips, {"dance_grpo": 1.0}, PROMPTS, media_type="video", video_infos=infos)
    )
    assert status == 200, answer
    status, result = service.result(answer["uuid"], "dance_grpo", timeout=120)
    assert status == 200, result
    scores = result["scores"]
    assert {"vq_reward", "mq_reward", "ta_reward", "overall_reward"} <= set(scores)
    assert result["type"] == "dance_grpo" and result["default_key"] == "overall_reward"
    assert result["frames"] == {"whole_clip": True, "frames": 10}
    assert result["input_info"]["video_infos"] == infos
    local = build_reward("dance_grpo", model=str(videoreward), dtype="float32")
    x = torch.from_numpy(clips).float() / 255.0
    expected = local.score(x, PROMPTS, [{"video_info": info} for info in infos])
    for key in ("vq_reward", "mq_reward", "ta_reward", "overall_reward"):
        assert scores[key] == pytest.approx(expected[key].tolist(), abs=1e-4)


def test_cosmos_reason1_hpsv3_and_unified_reward_are_served_under_cosmos_rl_names_and_keys(
    service, tiny_dirs
):
    clips = uint8_clips(1, frames=6, seed=3)
    status, answer = service.enqueue(
        body(
            clips, {"cosmos_reason1": 1.0}, PROMPTS[:1], media_type="video", video_infos=[{"video_fps": 16.0}]
        )
    )
    assert status == 200, answer
    status, result = service.result(answer["uuid"], "cosmos_reason1", timeout=120)
    assert status == 200 and {"no_score", "yes_logit", "no_logit"} <= set(result["scores"]), result
    local = build_reward("cosmos_reason1", model=str(tiny_dirs["qwen2_5_vl"]))
    x = torch.from_numpy(clips).float() / 255.0
    assert result["scores"]["no_score"] == pytest.approx(
        local.score(x, PROMPTS[:1])["no_score"].tolist(), abs=1e-5
    )
    pixels = np.random.default_rng(4).integers(0, 256, (2, 20, 28, 3), dtype=np.uint8)
    status, answer = service.enqueue(body(pixels, {"hpsv3": 1.0, "unified_reward": 1.0}, PROMPTS))
    assert status == 200, answer
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0
    status, result = service.result(answer["uuid"], "hpsv3", timeout=120)
    local = build_reward("hpsv3", model=str(tiny_dirs["hpsv3"]), base_model=str(tiny_dirs["qwen2_vl"]))
    assert status == 200 and result["scores"]["hpsv3"] == pytest.approx(
        local.score(images, PROMPTS)["hpsv3"].tolist(), abs=1e-5
    )
    status, result = service.result(answer["uuid"], "unified_reward", timeout=120)
    assert status == 200 and len(result["scores"]["unified_reward"]) == 2, result
    assert result["default_key"] == "unified_reward"


def test_trainer_remote_reward_equals_in_process_on_whole_clips(service, videoreward):
    config = RemoteRewardConfig(
        reward_fns=[RewardFnConfig(name="dance_grpo", weight=1.0, score_key="overall_reward")],
        video_frame_stride=4,  # a frame option of the run: whole-clip rewards ignore it, here and there
    )
    x = torch.from_numpy(uint8_clips(3, seed=1)).float() / 255.0
    prompts = [*PROMPTS, "x"]
    local = RewardFunction(config, options={"dance_grpo": {"model": str(videoreward), "dtype": "float32"}})(
        x, prompts
    )
    remote = RemoteRewardFunction(
        config,
        enqueue_url=f"{service.url}/api/reward/enqueue",
        fetch_url=f"{service.url}/api/reward/pull",
        token=TOKEN,
    )(x, prompts)
    torch.testing.assert_close(remote.total, local.total, atol=1e-4, rtol=0)


def test_missing_weights_stop_the_service_at_start_with_exit_code_2(tmp_path):
    require_redis()
    config = tmp_path / "missing.toml"
    config.write_text(
        f'port = {free_port()}\ntoken = "{TOKEN}"\n[workers]\ncount = 1\n'
        '[[reward_args]]\nreward_type = "dance_grpo"\nmodel_path = "KwaiVGI/VideoReward"\n'
    )
    run = subprocess.run(
        [sys.executable, "-m", "reward_service.cli", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "KwaiVGI/VideoReward" in run.stderr and "hf download" in run.stderr


def test_tiny_video_nft_trains_on_dance_grpo_through_the_service(service, tmp_path, monkeypatch):
    """Issue 18's "Done when", service half: the same tiny video DiffusionNFT iteration as
    tests/integration/test_vlm_video_train.py, its `dance_grpo` scores coming from sanarl-reward."""
    import math
    from pathlib import Path

    from sanarl import api
    from sanarl.methods.config_loading import load_config
    from sanarl.training.tracking import read_metrics

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests" / "integration"))
    from test_vlm_video_train import SHAPES, TINY_STEPS, dance_grpo_preset

    monkeypatch.setenv("REMOTE_REWARD_TOKEN", TOKEN)
    monkeypatch.setenv("REMOTE_REWARD_ENQUEUE_URL", f"{service.url}/api/reward/enqueue")
    monkeypatch.setenv("REMOTE_REWARD_FETCH_URL", f"{service.url}/api/reward/pull")
    preset = dance_grpo_preset(tmp_path, "")
    overrides = [
        f"train.output_dir={tmp_path / 'run'}",
        "train.train_policy.use_remote_reward=true",
        *TINY_STEPS,
    ]
    api.train(load_config(preset, overrides), SHAPES)
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records] == [1]
    assert math.isfinite(records[0]["loss"]) and records[0]["grad_norm"] > 0
    assert math.isfinite(records[0]["reward/dance_grpo"]) and "reward/dance_grpo/vq_reward" in records[0]
