"""CLIP-family rewards (pickscore, clipscore, aesthetic) on tiny random-init CLIP models saved to a temp dir.

Every reward loads its tiny model by path through the same `CLIPModel.from_pretrained(<dir>)` path real checkpoints
take; oracles are the transformers processor + `CLIPModel.forward` on PIL images, and hand-written matmuls.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards import RewardFunction, build_reward, known_rewards
from sanarl.rewards.clip_models import ClipEncoder, ImageTransform, center_crop
from sanarl.rewards.scorers.aesthetic import AESTHETIC_FILE, Aesthetic
from sanarl.rewards.scorers.clipscore import ClipScore
from sanarl.rewards.scorers.pickscore import PICKSCORE_MODEL, PICKSCORE_PROCESSOR, PickScore

pytestmark = pytest.mark.usefixtures("network")  # tests/conftest.py: the network is cut

transformers = pytest.importorskip("transformers")

LETTERS = "abcdefghijklmnopqrstuvwxyz"
PICK_LOGIT_SCALE = 3.0  # exp(3) = 20.09, so /26 and the raw scale differ visibly
PROMPTS = ["a red cat", "dog", "a very small blue house on a hill", "x", "two green birds"]
HEAD_SHAPES = [(1024, 768), (128, 1024), (64, 128), (16, 64), (1, 16)]
HEAD_INDICES = [0, 2, 4, 6, 7]  # the published head's Sequential indices (dropouts at 1, 3, 5)


def tiny_processor():
    """CLIP processor: character-level BPE tokenizer (end-of-text has the highest id), 32 px resize and crop."""
    vocab = {c: i for i, c in enumerate(LETTERS)}
    vocab.update({c + "</w>": len(LETTERS) + i for i, c in enumerate(LETTERS)})
    vocab.update({"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1})
    tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16)
    images = transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    return transformers.CLIPProcessor(image_processor=images, tokenizer=tokenizer), vocab


def tiny_clip(vocab: dict[str, int], logit_scale: float, seed: int):
    torch.manual_seed(seed)
    eos = vocab["<|endoftext|>"]
    text = dict(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=eos,
        pad_token_id=eos,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    config = transformers.CLIPConfig(
        text_config=text, vision_config=vision, projection_dim=768, logit_scale_init_value=logit_scale
    )
    return transformers.CLIPModel(config)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """`full`: model + processor (OpenAI-style logit scale 100); `pick_model` / `pick_proc`: PickScore-style split
    model and processor dirs; `ckpts`: a reward_ckpts dir with a random aesthetic head (state dict in `head`)."""
    root = tmp_path_factory.mktemp("tiny-clip")
    processor, vocab = tiny_processor()
    tiny_clip(vocab, math.log(100.0), seed=0).save_pretrained(root / "full")
    processor.save_pretrained(root / "full")
    tiny_clip(vocab, PICK_LOGIT_SCALE, seed=1).save_pretrained(root / "pick_model")
    processor.save_pretrained(root / "pick_proc")
    gen = torch.Generator().manual_seed(2)
    head = {}
    for index, shape in zip(HEAD_INDICES, HEAD_SHAPES, strict=True):
        head[f"layers.{index}.weight"] = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        head[f"layers.{index}.bias"] = torch.randn(shape[0], generator=gen) * 0.1
    (root / "ckpts").mkdir()
    torch.save(head, root / "ckpts" / AESTHETIC_FILE)
    return SimpleNamespace(**{k: root / k for k in ("full", "pick_model", "pick_proc", "ckpts")}, head=head)


def uint8_images(n: int, height: int = 32, width: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, height, width, 3), dtype=np.uint8)


def as_tensor(arrays: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255.0


def oracle_logits(model_dir, proc_dir, arrays: np.ndarray, prompts: list[str]) -> torch.Tensor:
    """diag(logits_per_image) from transformers' own processor (PIL path) and CLIPModel.forward; prompts are
    truncated to the tiny model's 16-token context, as the reference PickScore code truncates to 77."""
    model = transformers.CLIPModel.from_pretrained(str(model_dir)).eval()
    processor = transformers.CLIPProcessor.from_pretrained(str(proc_dir))
    inputs = processor(
        text=prompts,
        images=[Image.fromarray(a) for a in arrays],
        padding=True,
        truncation=True,
        max_length=16,
        return_tensors="pt",
    )
    with torch.no_grad():
        return model(**inputs).logits_per_image.diag()


# ---------------------------------------------------------------- scale conventions against the oracle


def test_pickscore_is_logit_scale_times_cosine_and_divided_by_26(dirs) -> None:
    arrays = uint8_images(3)
    reward = PickScore(model=str(dirs.pick_model), processor=str(dirs.pick_proc))
    scores = reward.score(as_tensor(arrays), PROMPTS[:3])
    expected = oracle_logits(dirs.pick_model, dirs.pick_proc, arrays, PROMPTS[:3])
    assert reward.encoder.logit_scale.item() == pytest.approx(math.exp(PICK_LOGIT_SCALE), rel=1e-6)
    assert scores["pickscore_raw"].tolist() == pytest.approx(expected.tolist(), abs=1e-4)
    assert scores["pickscore"].tolist() == pytest.approx((expected / 26).tolist(), abs=1e-5)
    assert reward.default_key == "pickscore" and set(scores) == {"pickscore", "pickscore_raw"}


def test_clipscore_is_cosine_equal_to_logits_over_100(dirs) -> None:
    arrays = uint8_images(3, seed=1)
    scores = ClipScore(model=str(dirs.full)).score(as_tensor(arrays), PROMPTS[2:])
    expected = oracle_logits(dirs.full, dirs.full, arrays, PROMPTS[2:]) / 100.0
    assert scores["clipscore"].tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert all(-1.0 <= v <= 1.0 for v in scores["clipscore"].tolist())


def test_aesthetic_equals_the_head_by_hand(dirs, monkeypatch) -> None:
    monkeypatch.setenv("SANARL_REWARD_CKPTS", str(dirs.ckpts))  # the default head path: <ckpts>/<file>
    arrays = uint8_images(4, seed=2)
    reward = Aesthetic(model=str(dirs.full))
    scores = reward.score(as_tensor(arrays), ["ignored"] * 4)
    model = transformers.CLIPModel.from_pretrained(str(dirs.full)).eval()
    pixels = transformers.CLIPImageProcessor.from_pretrained(str(dirs.full))(
        [Image.fromarray(a) for a in arrays], return_tensors="pt"
    )["pixel_values"]
    with torch.no_grad():
        x = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
    x = x / x.norm(dim=-1, keepdim=True)
    for index in HEAD_INDICES:  # affine layers only; dropout is the identity at inference
        x = x @ dirs.head[f"layers.{index}.weight"].T + dirs.head[f"layers.{index}.bias"]
    assert reward.head_path() == dirs.ckpts / AESTHETIC_FILE
    assert scores["aesthetic"].tolist() == pytest.approx(x[:, 0].tolist(), abs=1e-5)


# ---------------------------------------------------------------- batching, determinism, dtype, devices


def test_batched_scores_equal_one_by_one_and_are_deterministic(dirs) -> None:
    images = as_tensor(uint8_images(5, 40, 48, seed=3))  # 40 x 48: exercises the resize and the crop
    batched = PickScore(model=str(dirs.pick_model), processor=str(dirs.pick_proc), batch_size=2)
    single = PickScore(model=str(dirs.pick_model), processor=str(dirs.pick_proc), batch_size=1)
    together = batched.score(images, PROMPTS)
    alone = [single.score(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(5)]
    for key in ("pickscore", "pickscore_raw"):
        assert together[key].tolist() == pytest.approx([a[key].item() for a in alone], abs=1e-5)
    again = batched.score(images, PROMPTS)
    assert all(torch.equal(together[key], again[key]) for key in together)
    assert batched.encoder.model is single.encoder.model  # one copy per (dir, device, dtype)


def test_bfloat16_runs_and_stays_close_to_float32(dirs) -> None:
    images = as_tensor(uint8_images(4, seed=4))
    full = ClipScore(model=str(dirs.full)).score(images, PROMPTS[:4])["clipscore"]
    reward = ClipScore(model=str(dirs.full), dtype="bf16", device="cpu")
    half = reward.score(images, PROMPTS[:4])["clipscore"]
    assert reward.encoder.dtype == torch.bfloat16 and reward.encoder.model.dtype == torch.bfloat16
    assert reward.encoder.logit_scale.dtype == torch.float32
    assert reward.encoder.logit_scale.item() == pytest.approx(100.0, rel=1e-6)  # not exp(bf16(ln 100)) = 98.9
    assert half.dtype == torch.float32
    assert half.tolist() == pytest.approx(full.tolist(), abs=5e-3)
    assert not torch.equal(half, full)  # it really ran in bfloat16


def test_clipscore_and_aesthetic_share_one_frozen_model(dirs) -> None:
    clip = ClipScore(model=str(dirs.full))
    aesthetic = Aesthetic(model=str(dirs.full), mlp_path=str(dirs.ckpts / AESTHETIC_FILE))
    clip.setup("cpu")
    aesthetic.setup("cpu")
    assert clip.encoder.model is aesthetic.encoder.model and aesthetic.encoder.tokenizer is None
    assert not any(p.requires_grad for p in clip.encoder.model.parameters())
    assert not clip.encoder.model.training and not aesthetic.head.training


def test_gradients_can_flow_to_the_images_outside_no_grad(dirs) -> None:
    reward = ClipScore(model=str(dirs.full))
    reward.setup("cpu")
    images = as_tensor(uint8_images(2, 36, 36, seed=5)).requires_grad_(True)
    cosine = (reward.encoder.image_features(images) * reward.encoder.text_features(PROMPTS[:2])).sum(-1)
    cosine.sum().backward()
    assert images.grad is not None and torch.isfinite(images.grad).all() and images.grad.abs().sum() > 0
    # the score path itself keeps no graph
    assert not reward.score(images.detach(), PROMPTS[:2])["clipscore"].requires_grad


# ---------------------------------------------------------------- preprocessing by hand


def test_transform_by_hand_constant_image_and_crop_offsets(dirs) -> None:
    processor = transformers.CLIPImageProcessor.from_pretrained(str(dirs.full))
    transform = ImageTransform.from_processor(processor)
    assert (transform.shortest_edge, transform.crop) == (32, (32, 32))
    flat = transform(torch.full((1, 3, 48, 40), 0.5))  # resized to 38 x 32, then cropped
    mean, std = torch.tensor(transform.mean), torch.tensor(transform.std)
    assert tuple(flat.shape) == (1, 3, 32, 32)
    assert torch.allclose(flat, ((0.5 - mean) / std).view(1, 3, 1, 1).expand_as(flat), atol=1e-5)
    grid = torch.arange(32 * 40, dtype=torch.float32).view(1, 1, 32, 40)
    assert torch.equal(center_crop(grid, 32, 32), grid[..., :, 4:36])  # (40 - 32) // 2 = 4
    assert torch.equal(center_crop(grid, 32, 33)[..., 0, 0], grid[..., 0, 3])  # (40 - 33) // 2 = 3


def test_transform_matches_the_transformers_processor_when_resizing(dirs) -> None:
    ramp = np.linspace(0, 255, 64, dtype=np.float32).astype(np.uint8)[None, None, :, None]
    arrays = np.concatenate([uint8_images(2, 48, 64, seed=6), np.broadcast_to(ramp, (1, 48, 64, 3))])
    processor = transformers.CLIPImageProcessor.from_pretrained(str(dirs.full))
    expected = processor([Image.fromarray(a) for a in arrays], return_tensors="pt")["pixel_values"]
    ours = ImageTransform.from_processor(processor)(as_tensor(arrays))
    # both resize 48 x 64 -> 32 x 42 bicubic (antialiased) and crop 5 columns off the left; the processor rounds
    # to uint8 in between, we do not: differences are a few uint8 steps at most (std ~0.27 -> 1/255 ~ 0.015)
    assert tuple(ours.shape) == tuple(expected.shape) == (3, 3, 32, 32)
    assert (ours - expected).abs().mean() < 0.01 and (ours[2] - expected[2]).abs().max() < 0.02


# ---------------------------------------------------------------- weights resolution and errors


def test_missing_hub_weights_name_the_ids_and_touch_no_network(monkeypatch, tmp_path) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reward = build_reward("pickscore")
    with pytest.raises(WeightsError) as err:
        reward.score(torch.rand(1, 3, 32, 32), ["a cat"])
    msg = str(err.value)
    assert f"model {PICKSCORE_MODEL!r}" in msg and f"processor {PICKSCORE_PROCESSOR!r}" in msg
    assert "HF_HUB_OFFLINE" in msg and "config.json" in msg and "model.safetensors" in msg
    assert f"`hf download {PICKSCORE_MODEL}`" in msg and "model=... / processor=..." in msg
    assert err.value.exit_code == 2  # the autouse `network` fixture checks that nothing was attempted


def test_failed_download_is_a_weights_error_not_a_hub_traceback(monkeypatch, tmp_path, network) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(WeightsError) as err:
        ClipScore(model="nobody-here/tiny-clip").setup("cpu")
    msg = str(err.value)
    assert "model 'nobody-here/tiny-clip': not in the local Hub cache" in msg and "download failed" in msg
    assert msg.count("`hf download nobody-here/tiny-clip`") == 1  # model and processor: one command
    assert err.value.__cause__ is None and err.value.__context__ is None  # no chained hub traceback
    network.clear()  # trying the Hub is expected here (it failed fast: DNS is cut)


def test_incomplete_local_dirs_and_bad_paths_name_the_missing_files(dirs, tmp_path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    reward = ClipScore(model=str(tmp_path / "half"), processor=str(dirs.pick_model))
    with pytest.raises(WeightsError) as err:
        reward.score(torch.rand(1, 3, 32, 32), ["a cat"])
    msg = str(err.value)
    assert f"model '{tmp_path / 'half'}': directory lacks model.safetensors or pytorch_model.bin" in msg
    assert "directory lacks preprocessor_config.json or processor_config.json, tokenizer.json" in msg
    with pytest.raises(WeightsError, match="no such directory"):
        ClipScore(model=str(tmp_path / "nowhere")).score(torch.rand(1, 3, 32, 32), ["a cat"])


def test_missing_aesthetic_head_and_clip_are_reported_together(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # default head path: ./reward_ckpts/<file>, absent here
    monkeypatch.delenv("SANARL_REWARD_CKPTS", raising=False)
    with pytest.raises(WeightsError) as err:
        Aesthetic(model=str(tmp_path / "no-clip")).score(torch.rand(1, 3, 32, 32), ["x"])
    msg = str(err.value)
    assert f"mlp_path 'reward_ckpts/{AESTHETIC_FILE}': no such file" in msg
    assert "improved-aesthetic-predictor" in msg and "SANARL_REWARD_CKPTS" in msg
    assert f"model '{tmp_path / 'no-clip'}'" in msg


def test_aesthetic_head_that_does_not_fit_is_a_weights_error(dirs, tmp_path) -> None:
    small = {k: v[:, :16] if k == "layers.0.weight" else v for k, v in dirs.head.items()}
    torch.save(small, tmp_path / "small.pth")
    with pytest.raises(WeightsError, match="takes 16-d embeddings but CLIP model .* gives 768-d"):
        Aesthetic(model=str(dirs.full), mlp_path=str(tmp_path / "small.pth")).setup("cpu")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pth")
    with pytest.raises(WeightsError, match="not the LAION aesthetic head"):
        Aesthetic(model=str(dirs.full), mlp_path=str(tmp_path / "other.pth")).setup("cpu")


# ---------------------------------------------------------------- registry and options


def test_registered_lazily_and_options_are_checked(dirs) -> None:
    assert {"pickscore", "clipscore", "aesthetic"} <= set(known_rewards())
    assert isinstance(build_reward("clipscore", model=str(dirs.full), batch_size=3), ClipScore)
    with pytest.raises(ConfigError, match="dtype='int8'.*float32, bfloat16, float16"):
        build_reward("pickscore", dtype="int8")
    with pytest.raises(ConfigError, match="batch_size=0 must be a positive integer"):
        build_reward("aesthetic", batch_size=0)
    with pytest.raises(ConfigError, match="device='gpu0' is not a device"):
        build_reward("clipscore", device="gpu0")
    with pytest.raises(ConfigError, match="does not accept the options"):
        build_reward("clipscore", mlp_path="x")


def test_reward_function_combines_pickscore_by_its_default_key(dirs) -> None:
    cfg = RemoteRewardConfig(reward_fns=[RewardFnConfig(name="pickscore", weight=2.0)])
    options = {"pickscore": {"model": str(dirs.pick_model), "processor": str(dirs.pick_proc)}}
    fn = RewardFunction(cfg, options=options)
    images = as_tensor(uint8_images(2, seed=7))
    result = fn(images, PROMPTS[:2])
    direct = fn.rewards["pickscore"].score(images, PROMPTS[:2])
    assert result.total.tolist() == pytest.approx((2.0 * direct["pickscore"]).tolist(), rel=1e-6)
    assert result.per_key["pickscore/pickscore_raw"].tolist() == direct["pickscore_raw"].tolist()
    assert isinstance(fn.rewards["pickscore"].encoder, ClipEncoder)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_scores_cpu_images_like_the_cpu_model(dirs) -> None:
    images = as_tensor(uint8_images(3, 40, 48, seed=8))
    cpu = ClipScore(model=str(dirs.full)).score(images, PROMPTS[:3])["clipscore"]
    reward = ClipScore(model=str(dirs.full), device="cuda", dtype="bfloat16")
    gpu = reward.score(images, PROMPTS[:3])["clipscore"]
    assert reward.encoder.device.type == "cuda" and gpu.device.type == "cpu"
    assert gpu.tolist() == pytest.approx(cpu.tolist(), abs=5e-3)
