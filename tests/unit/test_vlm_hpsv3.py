"""`hpsv3` on a tiny random HPSv3 checkpoint (one full state dict in transformers 4 names, as HPSv3.safetensors
is): the pixel budget by hand, the prompt, the float32 ranknet head re-derived by hand at the reward token,
batch = one by one, Cosmos-RL's download_path layout, missing weights."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("torchvision")

from sanarl.errors import WeightsError  # noqa: E402
from sanarl.rewards import build_reward  # noqa: E402
from sanarl.rewards.scorers.vlm import hpsv3, qwen, tiny, vision  # noqa: E402

PROMPTS = ["a red cat", "a blue house on a hill", "x"]


@pytest.fixture(scope="module")
def base():
    return str(tiny.ensure_tiny_qwen_vl("qwen2_vl"))


@pytest.fixture(scope="module")
def reward(base):
    r = build_reward("hpsv3", model=str(tiny.ensure_tiny_hpsv3()), base_model=base, batch_size=2)
    r.setup("cpu")
    return r


def images(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, 24, 40, generator=torch.Generator().manual_seed(seed))


def test_fixed_pixel_budget_by_hand():
    # 24x40 -> 28x28 = 784 < 200704: beta = sqrt(200704 / 960) = 14.459; 24 beta / 28 = 12.39 -> 13 -> 364,
    # 40 beta / 28 = 20.66 -> 21 -> 588 (growing may overshoot max_pixels, as in qwen-vl-utils).
    assert vision.smart_resize(24, 40, 28, hpsv3.PIXELS, hpsv3.PIXELS) == (364, 588)
    # 512x512 -> 504x504 = 254016 > 200704: beta = sqrt(262144 / 200704) = 8 / 7; 512 * 7 / 8 = 448.
    assert vision.smart_resize(512, 512, 28, hpsv3.PIXELS, hpsv3.PIXELS) == (448, 448)


def test_prompt_is_hpsv3s_instruction_then_the_reward_token():
    text = hpsv3.build_text("a red cat")
    assert text.startswith(
        "\nYou are tasked with evaluating a generated image based on Visual Quality and Text"
    )
    assert "being the best. \n\n**Visual Quality:**  \nEvaluate" in text
    assert text.endswith(
        "Textual prompt - a red cat\n\n\n\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
    )
    assert text.count(hpsv3.REWARD_TOKEN) == 1


def test_score_is_mu_of_the_float32_ranknet_head_at_the_reward_token(reward):
    from safetensors.torch import load_file

    state = load_file(str(tiny.ensure_tiny_hpsv3() / "HPSv3.safetensors"))
    x = images(1)
    got = reward.score(x, PROMPTS[:1])
    batch = qwen.encode(reward.processor, reward.texts(PROMPTS[:1]), images=[reward.pixels_for(x[0])])
    hidden = qwen.sequential_hidden_states(reward.net.vlm, batch)[0]
    h = hidden[batch["input_ids"][0] == reward.reward_id][0].float()
    for i in (0, 3):  # Linear - ReLU (- Dropout, off in eval)
        h = torch.relu(h @ state[f"rm_head.{i}.weight"].T + state[f"rm_head.{i}.bias"])
    mu, sigma = (h @ state["rm_head.5.weight"].T + state["rm_head.5.bias"]).tolist()
    assert float(got["hpsv3"]) == pytest.approx(mu, abs=1e-5)
    assert float(got["hpsv3_sigma"]) == pytest.approx(sigma, abs=1e-5)
    assert next(reward.net.rm_head.parameters()).dtype == torch.float32


def test_batch_equals_one_by_one(reward):
    x = images()
    batch = reward.score(x, PROMPTS)["hpsv3"]
    single = torch.cat([reward.score(x[i : i + 1], [p])["hpsv3"] for i, p in enumerate(PROMPTS)])
    assert torch.allclose(batch, single, atol=1e-5)


def test_cosmos_rl_download_path_layout(tmp_path, base, reward):
    (tmp_path / "hpsv3").mkdir()
    shutil.copy(tiny.ensure_tiny_hpsv3() / "HPSv3.safetensors", tmp_path / "hpsv3" / "HPSv3.safetensors")
    other = build_reward("hpsv3", download_path=str(tmp_path), base_model=base)
    assert torch.allclose(
        other.score(images(1), PROMPTS[:1])["hpsv3"], reward.score(images(1), PROMPTS[:1])["hpsv3"]
    )


def test_missing_weights_name_the_ids(network):
    with pytest.raises(WeightsError, match="hf download MizzenAI/HPSv3") as info:
        build_reward("hpsv3").setup("cpu")
    assert "Qwen/Qwen2-VL-7B-Instruct" in str(info.value) or "MizzenAI/HPSv3" in str(info.value)
    assert info.value.exit_code == 2


def test_a_checkpoint_for_another_base_is_refused_naming_the_tensor(tmp_path, base):
    from safetensors.torch import load_file, save_file

    state = load_file(str(tiny.ensure_tiny_hpsv3() / "HPSv3.safetensors"))
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:-5]  # another tokenizer size
    save_file(state, str(tmp_path / "HPSv3.safetensors"))
    with pytest.raises(WeightsError, match="embed_tokens.weight has shape"):
        build_reward("hpsv3", model=str(tmp_path), base_model=base).setup("cpu")
