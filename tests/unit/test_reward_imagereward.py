"""The `imagereward` reward and its transformers-5 shim, against the installed image-reward package.

A tiny ImageReward (ViT 64 wide, 2 blocks, 8 px patches at 32 px; a 1-layer 768-wide BLIP text encoder; a 13-token
BERT vocabulary) is built from the package's own classes, saved as ImageReward.pt + med_config.json, and loaded
through the reward's loader. Oracle: the package's own `ImageReward.score(prompt, PIL image)`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards import build_reward, known_rewards
from sanarl.rewards.scorers import _ir_shim as shim

if importlib.util.find_spec("ImageReward") is None or importlib.util.find_spec("fairscale") is None:
    pytest.skip("image-reward / fairscale not installed (see docs/rewards.md)", allow_module_level=True)
from sanarl.rewards.scorers.imagereward import ImageReward, VitGeometry, build_model, load_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("network")  # tests/conftest.py: the network is cut

WORDS = ["a", "red", "cat", "dog", "photo", "of", "blue", "house"]
MED = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,  # the reward head is Linear(768, ...) in the package
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 40,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "vocab_size": 5 + len(WORDS) + 2,  # + [DEC], [ENC]
    "encoder_width": 64,
    "add_cross_attention": True,
}
PROMPTS = ["a red cat", "a photo of a dog", "blue house", "cat", "a photo of a red house of a blue dog"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-ir")
    (root / "tok").mkdir()
    (root / "tok" / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n"
    )
    ckpt = root / "ckpts" / "ImageReward"
    ckpt.mkdir(parents=True)
    (ckpt / "med_config.json").write_text(json.dumps(MED))
    torch.manual_seed(0)
    model = build_model(ckpt / "med_config.json", VitGeometry(64, 2, 8, 32), root / "tok")
    for layer in model.mlp.layers:  # the package's head init (std 1/769) gives near-constant scores
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=1.0 / math.sqrt(layer.in_features))
    torch.save(model.state_dict(), ckpt / "ImageReward.pt")
    return SimpleNamespace(root=root, ckpt=ckpt, tok=str(root / "tok"))


def uint8_images(n: int, height: int = 32, width: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, height, width, 3), dtype=np.uint8)


def as_tensor(arrays: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255.0


# ---------------------------------------------------------------- the shim


def test_shim_restores_the_names_med_imports() -> None:
    shim.apply_shim()
    import transformers.modeling_utils as mu
    import transformers.pytorch_utils as pu

    assert mu.apply_chunking_to_forward is pu.apply_chunking_to_forward
    assert mu.prune_linear_layer is pu.prune_linear_layer
    heads, index = mu.find_pruneable_heads_and_indices({1}, 3, 2, set())
    assert heads == {1} and index.tolist() == [0, 1, 4, 5] and index.dtype == torch.long
    # head 0 already gone: the layer has 2 heads left (old 1, 2); pruning old head 2 = current head 1
    heads, index = mu.find_pruneable_heads_and_indices({0, 2}, 2, 2, {0})
    assert heads == {2} and index.tolist() == [0, 1]


def test_shimmed_mask_helpers_by_hand() -> None:
    _, _, _ = shim.import_image_reward()
    med = importlib.import_module("ImageReward.models.BLIP.med")
    host = SimpleNamespace(dtype=torch.float32)
    mask = torch.tensor([[1, 1, 0]])
    inverted = med.BertPreTrainedModel.invert_attention_mask(host, mask)
    assert inverted.shape == (1, 1, 1, 3) and inverted[0, 0, 0, :2].tolist() == [0.0, 0.0]
    assert inverted[0, 0, 0, 2].item() == torch.finfo(torch.float32).min
    assert med.BertPreTrainedModel.get_head_mask(host, None, 3) == [None, None, None]
    assert med.BertPreTrainedModel.get_head_mask(host, torch.ones(2), 3).shape == (3, 1, 2, 1, 1)


def test_plain_import_of_the_package_works_or_fails_only_on_its_training_extras() -> None:
    shim.import_image_reward()
    try:
        package = importlib.import_module("ImageReward")
    except ModuleNotFoundError as exc:
        # the package __init__ pulls its training extras (ReFL needs `datasets`; openai-clip needs pkg_resources):
        # the only acceptable failure, and never a transformers-5 name the shim should have restored
        assert exc.name in {"datasets", "pkg_resources", "clip"}, exc
        return
    assert package.ImageReward is importlib.import_module("ImageReward.ImageReward").ImageReward


# ---------------------------------------------------------------- scores


def test_scores_equal_the_packages_own_score(tiny) -> None:
    arrays = uint8_images(3)
    reward = ImageReward(checkpoint_dir=str(tiny.ckpt), tokenizer=tiny.tok)
    scores = reward.score(as_tensor(arrays), PROMPTS[:3])["imagereward"]
    ir_module, _, _ = shim.import_image_reward()
    oracle = load_model(tiny.ckpt, tiny.root / "tok", torch.device("cpu"))
    oracle.preprocess = ir_module._transform(32)  # the package's PIL transform at the tiny image size
    expected = [oracle.score(p, Image.fromarray(a)) for p, a in zip(PROMPTS[:3], arrays, strict=True)]
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)
    assert isinstance(reward.model, ir_module.ImageReward) and scores.std() > 0.01


def test_batched_equals_one_by_one_and_is_deterministic(tiny, monkeypatch) -> None:
    monkeypatch.setenv("SANARL_REWARD_CKPTS", str(tiny.ckpt.parent))  # default dir: <ckpts>/ImageReward
    images = as_tensor(uint8_images(5, 40, 48, seed=1))
    batched = ImageReward(tokenizer=tiny.tok, batch_size=2)
    together = batched.score(images, PROMPTS)["imagereward"]
    single = ImageReward(tokenizer=tiny.tok, batch_size=1)
    alone = [single.score(images[i : i + 1], PROMPTS[i : i + 1])["imagereward"].item() for i in range(5)]
    assert batched.directory() == tiny.ckpt
    assert together.tolist() == pytest.approx(alone, abs=1e-5)
    assert torch.equal(batched.score(images, PROMPTS)["imagereward"], together)
    assert not batched.model.training and not any(p.requires_grad for p in batched.model.parameters())


def test_bfloat16_blip_runs_close_to_float32(tiny) -> None:
    images = as_tensor(uint8_images(2, seed=2))
    full = ImageReward(checkpoint_dir=str(tiny.ckpt), tokenizer=tiny.tok).score(images, PROMPTS[:2])
    reward = ImageReward(checkpoint_dir=str(tiny.ckpt), tokenizer=tiny.tok, dtype="bfloat16", device="cpu")
    half = reward.score(images, PROMPTS[:2])["imagereward"]
    assert reward.model.blip.visual_encoder.cls_token.dtype == torch.bfloat16
    assert reward.model.mlp.layers[0].weight.dtype == torch.float32 and half.dtype == torch.float32
    assert half.tolist() == pytest.approx(full["imagereward"].tolist(), abs=0.1)


# ---------------------------------------------------------------- errors and registry


def test_missing_files_and_tokenizer_are_named_together(tmp_path, monkeypatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SANARL_REWARD_CKPTS", raising=False)
    with pytest.raises(WeightsError) as err:
        ImageReward().score(torch.rand(1, 3, 32, 32), ["a cat"])
    msg = str(err.value)
    assert "checkpoint_dir 'reward_ckpts/ImageReward': lacks ImageReward.pt, med_config.json" in msg
    assert "hf download THUDM/ImageReward ImageReward.pt med_config.json" in msg
    assert (
        "tokenizer 'bert-base-uncased': no vocab.txt in the local Hub cache and HF_HUB_OFFLINE is set" in msg
    )
    assert err.value.exit_code == 2


def test_wrong_checkpoint_is_a_weights_error(tiny, tmp_path) -> None:
    (tmp_path / "med_config.json").write_text(json.dumps(MED))
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "ImageReward.pt")
    with pytest.raises(WeightsError, match="not an ImageReward checkpoint"):
        ImageReward(checkpoint_dir=str(tmp_path), tokenizer=tiny.tok).setup("cpu")
    state = torch.load(tiny.ckpt / "ImageReward.pt", weights_only=True)
    torch.save({k: v for k, v in state.items() if not k.startswith("mlp.")}, tmp_path / "ImageReward.pt")
    with pytest.raises(WeightsError, match="lacks 10 weights the score needs"):
        ImageReward(checkpoint_dir=str(tmp_path), tokenizer=tiny.tok).setup("cpu")


def test_registered_and_options_checked(tiny) -> None:
    assert "imagereward" in known_rewards()
    assert isinstance(build_reward("imagereward", checkpoint_dir=str(tiny.ckpt), batch_size=3), ImageReward)
    with pytest.raises(ConfigError, match="dtype='int8'"):
        build_reward("imagereward", dtype="int8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_scores_cpu_images_like_the_cpu_model(tiny) -> None:
    images = as_tensor(uint8_images(3, 40, 48, seed=3))
    cpu = ImageReward(checkpoint_dir=str(tiny.ckpt), tokenizer=tiny.tok).score(images, PROMPTS[:3])
    reward = ImageReward(checkpoint_dir=str(tiny.ckpt), tokenizer=tiny.tok, device="cuda")
    gpu = reward.score(images, PROMPTS[:3])["imagereward"]
    assert reward.model.blip.visual_encoder.cls_token.device.type == "cuda" and gpu.device.type == "cpu"
    assert gpu.tolist() == pytest.approx(cpu["imagereward"].tolist(), abs=1e-3)
