"""A model-backed reward behind the service: `clipscore` on a tiny random-init CLIP saved to a temp dir and
loaded by the worker through `model_path` (the path real weights take). Oracle: the same reward in-process."""

from __future__ import annotations

import pytest
import torch
from service_helpers import TOKEN, Service, body, free_port, images, require_redis

from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards import RewardFunction
from sanarl.rewards.clipscore import ClipScore
from sanarl.rewards.remote import RemoteRewardFunction

pytestmark = pytest.mark.service

PROMPTS = ["a red cat", "dog", "blue house on a hill", "x"]


def save_tiny_clip(directory) -> None:
    """A 1-layer CLIP (32-wide towers, 32 px images, character-level tokenizer) with its processor."""
    transformers = pytest.importorskip("transformers")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(letters)} | {c + "</w>": 26 + i for i, c in enumerate(letters)}
    vocab |= {"<|startoftext|>": 52, "<|endoftext|>": 53}
    tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16)
    pixels = transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    torch.manual_seed(0)
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = transformers.CLIPConfig(
        text_config={
            **tower,
            "vocab_size": 54,
            "max_position_embeddings": 16,
            "bos_token_id": 52,
            "eos_token_id": 53,
            "pad_token_id": 53,
        },
        vision_config={**tower, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    transformers.CLIPModel(config).save_pretrained(directory)
    transformers.CLIPProcessor(image_processor=pixels, tokenizer=tokenizer).save_pretrained(directory)


@pytest.fixture(scope="module")
def clip_service(tmp_path_factory):
    require_redis()
    tmp = tmp_path_factory.mktemp("clip-service")
    save_tiny_clip(tmp / "clip")
    port = free_port()
    text = f"""
port = {port}
token = "{TOKEN}"
log_level = "warning"
[workers]
count = 1
torch_threads = 1
[[reward_args]]
reward_type = "clipscore"
model_path = "{tmp / "clip"}"
dtype = "float32"
options = {{ batch_size = 8 }}
"""
    service = Service(tmp, "clip", text, port).start()
    try:
        service.wait_healthy(timeout=180)
        yield service, str(tmp / "clip")
    finally:
        assert service.stop() == 0


def test_tiny_clip_scores_equal_in_process(clip_service):
    service, model = clip_service
    pixels = images(4, 40, seed=3)
    status, answer = service.enqueue(body(pixels, {"clipscore": 1.0}, PROMPTS))
    assert status == 200
    status, answer = service.result(answer["uuid"], "clipscore")
    assert status == 200, answer
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0
    expected = ClipScore(model=model, dtype="float32", batch_size=8).score(x, PROMPTS)["clipscore"]
    assert answer["scores"]["clipscore"] == pytest.approx(expected.tolist(), abs=1e-6)
    assert answer["default_key"] == "clipscore" and answer["input_info"]["shape"] == [4, 40, 40, 3]


def test_remote_reward_function_equals_in_process_for_clip(clip_service):
    service, model = clip_service
    config = RemoteRewardConfig(
        reward_fns=[RewardFnConfig(name="clipscore", weight=3.0, clip_min=-0.5)], scale=2.0
    )
    x = torch.from_numpy(images(4, 32, seed=4)).permute(0, 3, 1, 2).float() / 255.0
    local = RewardFunction(config, options={"clipscore": {"model": model, "batch_size": 8}})(x, PROMPTS)
    remote = RemoteRewardFunction(
        config,
        enqueue_url=f"{service.url}/api/reward/enqueue",
        fetch_url=f"{service.url}/api/reward/pull",
        token=TOKEN,
    )
    got = remote(x, PROMPTS)
    torch.testing.assert_close(got.total, local.total, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.per_key["clipscore"], local.per_key["clipscore"], atol=1e-6, rtol=0)
