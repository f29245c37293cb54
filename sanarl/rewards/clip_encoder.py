"""A frozen transformers CLIPModel with its tensor preprocessing and tokenizer, turning images and prompts into
features.

Models are loaded with `CLIPModel.from_pretrained(<local directory>)` (directories from `sanarl.rewards.weight_files`),
the one code path real and tiny test checkpoints share, and cached by (directory, device, dtype) so that rewards
sharing a checkpoint share one copy. Features are computed in the configured dtype on the configured device,
`batch_size` samples at a time, and returned L2-normalised in float32:
`normalize(visual_projection(vision_model(x).pooler_output))` and
`normalize(text_projection(text_model(ids).pooler_output))` (Radford et al. 2021, CLIP).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sanarl.errors import WeightsError
from sanarl.rewards.clip_preprocess import ImageTransform


@dataclass(frozen=True)
class LoadedClip:
    """A frozen CLIPModel in eval mode and its `exp(logit_scale)` read in float32 before any dtype cast (a bfloat16
    logit scale would be off by up to 1%: ln 100 = 4.6052 rounds to 4.5938, exp = 98.9)."""

    model: Any
    logit_scale: torch.Tensor


_models: dict[tuple[str, str, torch.dtype], LoadedClip] = {}
_models_lock = threading.Lock()


def load_clip_model(directory: Path, device: torch.device, dtype: torch.dtype) -> LoadedClip:
    """`CLIPModel.from_pretrained(directory)`, moved to `device` and cast to `dtype`, frozen, in eval mode.

    Cached by (directory, device, dtype), so rewards sharing a checkpoint (clipscore and aesthetic both use CLIP
    ViT-L/14) share one copy. Loads in float32 first (the checkpoints' own precision) to keep the logit scale exact.
    """
    key = (str(Path(directory).resolve()), str(device), dtype)
    with _models_lock:
        if key not in _models:
            from transformers import CLIPModel

            try:
                model = CLIPModel.from_pretrained(str(directory), dtype=torch.float32)
            except (OSError, ValueError) as exc:
                raise WeightsError(
                    f"{directory}: cannot load a transformers CLIPModel ({type(exc).__name__}: {exc}); point the "
                    "reward's model option at a CLIP checkpoint directory (config.json + model.safetensors)."
                ) from None
            scale = model.logit_scale.detach().float().exp().to(device)
            model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
            _models[key] = LoadedClip(model, scale)
        return _models[key]


def clear_model_cache() -> None:
    """Forget every cached CLIP model (frees their memory once no reward holds them)."""
    with _models_lock:
        _models.clear()


def _load_processor_part(kind: str, directory: Path) -> Any:
    """AutoTokenizer ('tokenizer') or AutoImageProcessor ('image') from `directory`; WeightsError on failure."""
    from transformers import AutoImageProcessor, AutoTokenizer

    loader = AutoTokenizer if kind == "tokenizer" else AutoImageProcessor
    try:
        return loader.from_pretrained(str(directory))
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(
            f"{directory}: cannot load a CLIP {kind} ({type(exc).__name__}: {exc}); point the reward's processor "
            "option at a CLIP processor directory (preprocessor_config.json, tokenizer.json)."
        ) from None


class ClipEncoder:
    """A frozen CLIP model with its tensor preprocessing and tokenizer: L2-normalised float32 features, batched.

    Args:
        loaded: the model (already on its device and dtype) with its float32 logit scale.
        transform: the image preprocessing (see ImageTransform).
        tokenizer: the CLIP tokenizer, or None when only images are encoded.
        batch_size: samples per forward pass (results do not depend on it beyond float round-off).
    """

    def __init__(
        self, loaded: LoadedClip, transform: ImageTransform, tokenizer: Any, batch_size: int
    ) -> None:
        model = self.model = loaded.model
        self._logit_scale = loaded.logit_scale
        self.transform = transform
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        limits = [model.config.text_config.max_position_embeddings]
        if tokenizer is not None and isinstance(getattr(tokenizer, "model_max_length", None), int):
            limits.append(tokenizer.model_max_length)
        self.max_length = min(limits)

    @classmethod
    def load(
        cls,
        model_dir: Path,
        processor_dir: Path,
        *,
        device: torch.device,
        dtype: torch.dtype,
        batch_size: int,
        text: bool = True,
    ) -> ClipEncoder:
        """Load from local directories (see `sanarl.rewards.weight_files.resolve_dirs`); the model is shared through the model cache."""
        loaded = load_clip_model(model_dir, device, dtype)
        transform = ImageTransform.from_processor(_load_processor_part("image", processor_dir))
        tokenizer = _load_processor_part("tokenizer", processor_dir) if text else None
        return cls(loaded, transform, tokenizer, batch_size)

    @property
    def logit_scale(self) -> torch.Tensor:
        """`exp(model.logit_scale)`, float32 scalar from the float32 checkpoint (100 for OpenAI CLIP; PickScore
        learns its own)."""
        return self._logit_scale

    @property
    def embed_dim(self) -> int:
        """Dimension D of the joint image-text embedding (`projection_dim`)."""
        return int(self.model.config.projection_dim)

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """Images `[B, 3, H, W]` in [0, 1] (any device) -> unit-norm features `[B, D]` float32 on `self.device`."""
        features = []
        for chunk in images.split(self.batch_size):
            pixels = self.transform(chunk.to(self.device)).to(self.dtype)
            pooled = self.model.vision_model(pixel_values=pixels).pooler_output
            features.append(F.normalize(self.model.visual_projection(pooled).float(), dim=-1))
        return torch.cat(features)

    def text_features(self, prompts: Sequence[str]) -> torch.Tensor:
        """B prompts -> unit-norm features `[B, D]` float32 on `self.device` (truncated to the model's context,
        77 tokens for CLIP; each chunk padded to its longest prompt, which the causal mask makes irrelevant)."""
        if self.tokenizer is None:
            raise RuntimeError("this ClipEncoder was loaded without a tokenizer (text=False)")
        features = []
        for start in range(0, len(prompts), self.batch_size):
            tokens = self.tokenizer(
                list(prompts[start : start + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            pooled = self.model.text_model(
                input_ids=tokens["input_ids"].to(self.device),
                attention_mask=tokens["attention_mask"].to(self.device),
            ).pooler_output
            features.append(F.normalize(self.model.text_projection(pooled).float(), dim=-1))
        return torch.cat(features)
