"""The `hpsv2` reward on a tiny random open_clip model whose state dict is saved as the HPS checkpoint file and loaded
through the real loader (`open_clip.create_model(arch, pretrained=None)` + strict `load_state_dict`).

Oracle: open_clip's own validation transform (PIL) and `CLIP.forward` (normalised features), diag of the product.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards import build_reward, known_rewards
from sanarl.rewards.scorers.hpsv2 import HPS_FILE, HPSv2

pytestmark = pytest.mark.usefixtures("network")  # tests/conftest.py: the network is cut

open_clip = pytest.importorskip("open_clip")

TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
PROMPTS = ["a red cat", "a dog on a skateboard", "x", "two green birds", "a very small blue house on a hill"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`arch`: the tiny open_clip config file; `ckpts`: a reward_ckpts dir with its random weights as the HPS file
    (wrapped as {"state_dict": ...} like the published file); `other`: weights of a different architecture."""
    root = tmp_path_factory.mktemp("tiny-hps")
    arch = root / "sanarl-tiny-hps.json"
    arch.write_text(json.dumps(TINY))
    open_clip.add_model_config(arch)
    torch.manual_seed(0)
    model = open_clip.create_model("sanarl-tiny-hps", pretrained=None, load_weights=False)
    (root / "ckpts").mkdir()
    torch.save({"state_dict": model.state_dict()}, root / "ckpts" / HPS_FILE)
    wide = json.loads(json.dumps(TINY))
    wide["embed_dim"] = 24
    (root / "sanarl-tiny-wide.json").write_text(json.dumps(wide))
    open_clip.add_model_config(root / "sanarl-tiny-wide.json")
    other = open_clip.create_model("sanarl-tiny-wide", pretrained=None, load_weights=False)
    torch.save(other.state_dict(), root / "other.pt")
    return SimpleNamespace(
        arch=str(arch), ckpts=root / "ckpts", ckpt=str(root / "ckpts" / HPS_FILE), other=root / "other.pt"
    )


def uint8_images(n: int, height: int = 32, width: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, height, width, 3), dtype=np.uint8)


def as_tensor(arrays: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255.0


def test_score_is_the_cosine_of_open_clips_own_forward(tiny, monkeypatch) -> None:
    monkeypatch.setenv("SANARL_REWARD_CKPTS", str(tiny.ckpts))  # default path: <ckpts>/HPS_v2.1_compressed.pt
    arrays = uint8_images(3)
    reward = HPSv2(architecture=tiny.arch)
    scores = reward.score(as_tensor(arrays), PROMPTS[:3])["hpsv2"]
    assert reward.checkpoint_path() == tiny.ckpts / HPS_FILE
    model, _, preprocess = open_clip.create_model_and_transforms("sanarl-tiny-hps", pretrained=tiny.ckpt)
    model.eval()
    pixels = torch.stack([preprocess(Image.fromarray(a)) for a in arrays])
    with torch.no_grad():
        image_features, text_features, _ = model(
            pixels, open_clip.get_tokenizer("sanarl-tiny-hps")(PROMPTS[:3])
        )
    expected = (image_features @ text_features.T).diag()
    assert scores.tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert all(-1.0 <= s <= 1.0 for s in scores.tolist()) and scores.dtype == torch.float32


def test_batched_equals_one_by_one_and_is_deterministic(tiny) -> None:
    images = as_tensor(uint8_images(5, 40, 48, seed=1))  # exercises the resize and the crop
    batched = HPSv2(checkpoint=tiny.ckpt, architecture=tiny.arch, batch_size=2)
    together = batched.score(images, PROMPTS)["hpsv2"]
    single = HPSv2(checkpoint=tiny.ckpt, architecture=tiny.arch, batch_size=1)
    alone = [single.score(images[i : i + 1], PROMPTS[i : i + 1])["hpsv2"].item() for i in range(5)]
    assert together.tolist() == pytest.approx(alone, abs=1e-5)
    assert torch.equal(batched.score(images, PROMPTS)["hpsv2"], together)
    assert not any(p.requires_grad for p in batched.model.parameters()) and not batched.model.training


def test_bfloat16_runs_close_to_float32(tiny) -> None:
    images = as_tensor(uint8_images(3, seed=2))
    full = HPSv2(checkpoint=tiny.ckpt, architecture=tiny.arch).score(images, PROMPTS[:3])["hpsv2"]
    reward = HPSv2(checkpoint=tiny.ckpt, architecture=tiny.arch, dtype="bf16", device="cpu")
    half = reward.score(images, PROMPTS[:3])["hpsv2"]
    assert next(reward.model.parameters()).dtype == torch.bfloat16 and half.dtype == torch.float32
    assert half.tolist() == pytest.approx(full.tolist(), abs=2e-2) and not torch.equal(half, full)


def test_missing_checkpoint_names_the_file_and_where_to_put_it(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SANARL_REWARD_CKPTS", raising=False)
    with pytest.raises(WeightsError) as err:
        HPSv2().score(torch.rand(1, 3, 32, 32), ["a cat"])
    msg = str(err.value)
    assert f"checkpoint 'reward_ckpts/{HPS_FILE}': no such file" in msg
    assert "xswu/HPSv2" in msg and "SANARL_REWARD_CKPTS" in msg and "checkpoint=..." in msg
    assert err.value.exit_code == 2


def test_checkpoint_of_another_architecture_is_a_weights_error(tiny, tmp_path) -> None:
    with pytest.raises(WeightsError, match="does not fit open_clip 'sanarl-tiny-hps'"):
        HPSv2(checkpoint=str(tiny.other), architecture=tiny.arch).setup("cpu")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="cannot read the HPS checkpoint"):
        HPSv2(checkpoint=str(tmp_path / "junk.pt"), architecture=tiny.arch).setup("cpu")


def test_registered_and_options_checked(tiny, tmp_path) -> None:
    assert "hpsv2" in known_rewards()
    assert isinstance(build_reward("hpsv2", checkpoint=tiny.ckpt, batch_size=4), HPSv2)
    with pytest.raises(ConfigError, match="architecture='ViT-Q-99' is not an open_clip model"):
        HPSv2(checkpoint=tiny.ckpt, architecture="ViT-Q-99").setup("cpu")
    with pytest.raises(ConfigError, match="no such open_clip config file"):
        HPSv2(checkpoint=tiny.ckpt, architecture=str(tmp_path / "none.json")).setup("cpu")
    with pytest.raises(ConfigError, match="batch_size=0"):
        build_reward("hpsv2", batch_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_scores_cpu_images_like_the_cpu_model(tiny) -> None:
    images = as_tensor(uint8_images(3, 40, 48, seed=3))
    cpu = HPSv2(checkpoint=tiny.ckpt, architecture=tiny.arch).score(images, PROMPTS[:3])["hpsv2"]
    reward = HPSv2(checkpoint=tiny.ckpt, architecture=tiny.arch, device="cuda", dtype="bfloat16")
    gpu = reward.score(images, PROMPTS[:3])["hpsv2"]
    assert next(reward.model.parameters()).device.type == "cuda" and gpu.device.type == "cpu"
    assert gpu.tolist() == pytest.approx(cpu.tolist(), abs=2e-2)
