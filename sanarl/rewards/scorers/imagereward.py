"""The `imagereward` reward: ImageReward v1.0 (Xu et al. 2023, "ImageReward"), a BLIP model with a reward head.

    feature = BLIP text encoder([CLS] prompt, cross-attending to ViT(image)).last_hidden_state[:, 0]   [B, 768]
    imagereward = (MLP(feature) - 0.16717362830052426) / 1.0333394966054072

The mean/std normalisation is the package's own (`ImageReward.ImageReward.mean` / `.std`), so the score is the raw
ImageReward value reported in the paper (about -2..2, 0 = average). The model class is the installed package's
`ImageReward.ImageReward` (pip `image-reward`), imported through `_ir_shim` (transformers 5 compatibility) and built
from local files only; `RM.load("ImageReward-v1.0")` is never called (it downloads):

- `<checkpoint_dir>/ImageReward.pt` (state dict) and `<checkpoint_dir>/med_config.json` (the BLIP text-encoder
  config), default `checkpoint_dir = <reward_ckpts>/ImageReward` (`$SANARL_REWARD_CKPTS`, default `./reward_ckpts`);
- the BERT tokenizer (`vocab.txt`) of `bert-base-uncased`: the `tokenizer` option, a local directory or a Hub id
  resolved from the local Hub cache first (BLIP adds `[DEC]` and `[ENC]` to it, as the package does).

The ViT geometry (width, depth, patch, image size) is read from the checkpoint (ImageReward v1.0: ViT-L/16 at 224,
16 heads), heads = width / 64. Preprocessing on tensors: resize the shortest side to the image size bicubic, center
crop, normalise with CLIP mean/std (the package's `_transform`); prompts are padded to 35 tokens, as the package
does. Key: `imagereward`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards.clip_preprocess import ImageTransform
from sanarl.rewards.model_reward import ModelReward
from sanarl.rewards.weight_files import (
    Missing,
    hub_offline,
    missing_weights_error,
    no_download_reason,
    read_state_dict,
    reward_ckpt_path,
)

IR_FILES = ("ImageReward.pt", "med_config.json")
IR_REPO = "THUDM/ImageReward"
TOKENIZER = "bert-base-uncased"
MAX_TOKENS = 35
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
INSTALL = "pip install --no-deps image-reward==1.5 fairscale==0.4.13 (plus timm)"
_build_lock = threading.Lock()


@dataclass(frozen=True)
class VitGeometry:
    """The BLIP ViT read from a state dict: width D, depth, patch size, image size, heads (D / 64)."""

    width: int
    depth: int
    patch: int
    image_size: int

    @property
    def heads(self) -> int:
        return max(1, self.width // 64)

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor], path: Path) -> VitGeometry:
        prefix = "blip.visual_encoder."
        pos, proj = state.get(prefix + "pos_embed"), state.get(prefix + "patch_embed.proj.weight")
        if not isinstance(pos, torch.Tensor) or not isinstance(proj, torch.Tensor):
            raise WeightsError(
                f"{path}: no {prefix}pos_embed / patch_embed weights, so this is not an ImageReward checkpoint "
                f"(keys start {sorted(state)[:4]}); use ImageReward.pt from {IR_REPO}."
            )
        blocks = {
            int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"blocks\.(\d+)\.", k))
        }
        side = int(round((pos.shape[1] - 1) ** 0.5))
        return cls(int(pos.shape[2]), len(blocks), int(proj.shape[-1]), side * int(proj.shape[-1]))


def _resolve_tokenizer(name: str) -> Path | Missing:
    """A local directory holding the BERT `vocab.txt` for `name` (a path, or a Hub id from the cache / Hub)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return (
            path
            if (path / "vocab.txt").is_file()
            else Missing("tokenizer", name, "directory lacks vocab.txt")
        )
    from huggingface_hub import snapshot_download

    offline = hub_offline()
    ids = [name, f"google-bert/{name}"] if "/" not in name else [name]
    for local_only in (True, False) if not offline else (True,):
        for repo in ids:
            try:
                got = Path(
                    snapshot_download(
                        repo,
                        allow_patterns=["vocab.txt", "tokenizer_config.json"],
                        local_files_only=local_only,
                    )
                )
            except Exception:
                continue
            if (got / "vocab.txt").is_file():
                return got
    why = no_download_reason() if offline else "the download failed"
    return Missing("tokenizer", name, f"no vocab.txt in the local Hub cache and {why}")


def build_model(med_config: Path, geometry: VitGeometry, tokenizer_dir: Path, device: str = "cpu") -> Any:
    """A randomly initialised `ImageReward.ImageReward` with the given ViT geometry and a local BERT tokenizer.

    The package hard-codes `create_vit('large')` and a downloading `init_tokenizer()`; both are swapped (under a
    lock, restored after) for a ViT of `geometry` and the tokenizer of `tokenizer_dir` with BLIP's extra tokens.
    """
    from sanarl.rewards.scorers._ir_shim import import_image_reward

    ir_module, blip, vit_module = import_image_reward()
    from transformers import BertTokenizer

    def create_vit(*args: Any, **kwargs: Any) -> tuple[Any, int]:
        g = geometry
        vit = vit_module.VisionTransformer(
            img_size=g.image_size, patch_size=g.patch, embed_dim=g.width, depth=g.depth, num_heads=g.heads
        )
        return vit, g.width

    def init_tokenizer() -> Any:
        tokenizer = BertTokenizer.from_pretrained(str(tokenizer_dir))
        tokenizer.add_special_tokens({"bos_token": "[DEC]"})
        tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        tokenizer.enc_token_id = tokenizer.convert_tokens_to_ids("[ENC]")
        return tokenizer

    with _build_lock:
        saved = blip.create_vit, blip.init_tokenizer
        blip.create_vit, blip.init_tokenizer = create_vit, init_tokenizer
        try:
            return ir_module.ImageReward(med_config=str(med_config), device=device)
        finally:
            blip.create_vit, blip.init_tokenizer = saved


def load_model(directory: Path, tokenizer_dir: Path, device: torch.device) -> Any:
    """`build_model` + the checkpoint (as the package loads it: non-strict, but every weight the score uses must
    be present); eval mode, frozen, float32, on `device`."""
    path = directory / "ImageReward.pt"
    state = dict(read_state_dict(path, "the ImageReward checkpoint", f"ImageReward.pt from {IR_REPO}"))
    model = build_model(
        directory / "med_config.json", VitGeometry.of(state, path), tokenizer_dir, str(device)
    )
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches raise even when not strict
        raise WeightsError(
            f"{path}: does not fit the model of {directory / 'med_config.json'} ({str(exc).splitlines()[-1].strip()}); "
            f"use ImageReward.pt and med_config.json from {IR_REPO}."
        ) from None
    needed = [k for k in result.missing_keys if not k.startswith(("blip.vision_proj", "blip.text_proj"))]
    needed = [k for k in needed if not k.endswith("position_ids")]
    if needed:
        raise WeightsError(
            f"{path}: the checkpoint lacks {len(needed)} weights the score needs (e.g. {needed[:3]}), or "
            f"med_config.json does not match it; use ImageReward.pt and med_config.json from {IR_REPO}."
        )
    return model.to(device).eval().requires_grad_(False)


class ImageReward(ModelReward):
    """ImageReward v1.0 of each (image, prompt) pair; see the module doc.

    Args:
        checkpoint_dir: directory with ImageReward.pt and med_config.json; None = `<reward_ckpts>/ImageReward`.
        tokenizer: BERT tokenizer directory (with vocab.txt) or Hub id (default bert-base-uncased, cache first).
        device, dtype, batch_size (pairs per forward pass): see `ModelReward` (dtype is BLIP's; the reward head
            always runs in float32).
    """

    name = "imagereward"

    def __init__(
        self,
        checkpoint_dir: str | None = None,
        tokenizer: str = TOKENIZER,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 16,
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.tokenizer_name = str(tokenizer)
        super().__init__(device, dtype, batch_size)
        self.model: Any = None
        self.transform: ImageTransform | None = None

    def directory(self) -> Path:
        """Where ImageReward.pt and med_config.json are read from (see `checkpoint_dir`)."""
        return reward_ckpt_path(self.checkpoint_dir, "ImageReward")

    def check_weights(self) -> tuple[Path, Path]:
        """(checkpoint directory, tokenizer directory), without loading; one WeightsError for everything missing."""
        directory, missing = self.directory(), []
        absent = [f for f in IR_FILES if not (directory / f).is_file()]
        if absent:
            fix = (
                f"Download them with `hf download {IR_REPO} {' '.join(IR_FILES)} --local-dir {directory}` (or set "
                "$SANARL_REWARD_CKPTS to a directory holding ImageReward/, or pass the reward option "
                "checkpoint_dir=...)."
            )
            missing.append(Missing("checkpoint_dir", str(directory), f"lacks {', '.join(absent)}", fix))
        tokenizer = _resolve_tokenizer(self.tokenizer_name)
        if isinstance(tokenizer, Missing):
            missing.append(tokenizer)
        if missing:
            raise missing_weights_error(self.name, missing)
        assert isinstance(tokenizer, Path)
        return directory, tokenizer

    def _load(self) -> None:
        directory, tokenizer = self.check_weights()
        try:
            model = load_model(directory, tokenizer, self.device)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"reward 'imagereward' needs the image-reward package and its BLIP imports ({exc}); install them "
                f"with {INSTALL}, or remove this reward."
            ) from None
        model.blip.to(self.dtype)
        model.mlp.float()
        size = int(model.blip.visual_encoder.patch_embed.img_size[0])
        self.transform = ImageTransform.square(size, CLIP_MEAN, CLIP_STD)
        self.model = model

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] and B prompts -> `{imagereward: [B]}` (the package's `score_gard` math)."""
        assert self.model is not None and self.transform is not None
        blip, out = self.model.blip, []
        for start in range(0, len(prompts), self.batch_size):
            pixels = self.transform(images[start : start + self.batch_size].to(self.device)).to(self.dtype)
            tokens = blip.tokenizer(
                prompts[start : start + self.batch_size],
                padding="max_length",
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            )
            image_embeds = blip.visual_encoder(pixels)
            text = blip.text_encoder(
                tokens["input_ids"].to(self.device),
                attention_mask=tokens["attention_mask"].to(self.device),
                encoder_hidden_states=image_embeds,
                encoder_attention_mask=torch.ones(
                    image_embeds.shape[:-1], dtype=torch.long, device=self.device
                ),
                return_dict=True,
            )
            reward = self.model.mlp(text.last_hidden_state[:, 0, :].float()).squeeze(-1)
            out.append((reward - self.model.mean) / self.model.std)
        return {"imagereward": torch.cat(out)}
