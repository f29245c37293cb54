"""The CLIP-family rewards' base (pickscore, clipscore, aesthetic) and the public face of their machinery.

Weights: a reward's `model` / `processor` option is a local directory (a `save_pretrained` folder) or a Hub id,
resolved local-first by `sanarl.rewards.weight_files` (one `WeightsError` names everything missing). The model is loaded
with `CLIPModel.from_pretrained(<local directory>)` and turned into features by `sanarl.rewards.clip_encoder`;
images are preprocessed on tensors by `sanarl.rewards.clip_preprocess`. This module re-exports the names users of
the CLIP machinery need (`ClipEncoder`, `ImageTransform`, `center_crop`, `clear_model_cache`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from sanarl.rewards.clip_encoder import ClipEncoder, LoadedClip, clear_model_cache, load_clip_model
from sanarl.rewards.clip_preprocess import ImageTransform, center_crop, resize_shortest_edge
from sanarl.rewards.model_reward import ModelReward
from sanarl.rewards.weight_files import Missing, resolve_dirs

__all__ = [
    "ClipEncoder",
    "ClipReward",
    "ImageTransform",
    "LoadedClip",
    "center_crop",
    "clear_model_cache",
    "load_clip_model",
    "resize_shortest_edge",
]


class ClipReward(ModelReward):
    """Base of the CLIP-family rewards: options, lazy local-first loading, one `ClipEncoder` in `self.encoder`.

    A subclass names its checkpoint in `model_default` (and `processor_default` when its processor lives elsewhere);
    one that takes no more options needs no constructor.

    Args:
        model: CLIP model directory or Hub id; None = `model_default`.
        processor: processor (tokenizer + image preprocessing) directory or Hub id; None = `processor_default`,
            empty = `model`.
        device: where the model runs (None = the device given to `setup`, CPU by default).
        dtype: float32 | bfloat16 | float16 (features and scores are returned in float32 either way).
        batch_size: images (and prompts) per forward pass.
    """

    needs_text: bool = True
    model_default: str = ""
    """The `model` option's default: the reward's CLIP checkpoint (Hub id)."""
    processor_default: str | None = None
    """The `processor` option's default (None = the model's own processor)."""

    def __init__(
        self,
        model: str | None = None,
        processor: str | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = "float32",
        batch_size: int = 32,
    ) -> None:
        super().__init__(device, dtype, batch_size)
        self.model_name = str(self.model_default if model is None else model)
        processor = self.processor_default if processor is None else processor
        self.processor_name = str(processor) if processor else self.model_name
        self.encoder: ClipEncoder | None = None

    def check_weights(self, also_missing: Sequence[Missing] = ()) -> dict[str, Path]:
        """The local CLIP model and processor directories, without loading; one WeightsError naming everything
        missing (with `also_missing`, e.g. a head file a subclass looked for)."""
        kind = "processor" if self.needs_text else "image_processor"
        wanted = {"model": (self.model_name, "model"), "processor": (self.processor_name, kind)}
        return resolve_dirs(self.name, wanted, also_missing)

    def _load_encoder(self, also_missing: Sequence[Missing] = ()) -> ClipEncoder:
        """Resolve and load the CLIP model and processor (one WeightsError for everything missing)."""
        dirs = self.check_weights(also_missing)
        return ClipEncoder.load(
            dirs["model"],
            dirs["processor"],
            device=self.device,
            dtype=self.dtype,
            batch_size=self.batch_size,
            text=self.needs_text,
        )

    def _load(self) -> None:
        self.encoder = self._load_encoder()

    def _encoder(self) -> ClipEncoder:
        if self.encoder is None:  # Reward.score always loads first; this guards direct _score calls
            self.setup(self.device)
        assert self.encoder is not None
        return self.encoder

    def similarity(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """cos(image, prompt) in CLIP space of each pair, `[B]` float32 (the features are unit-norm)."""
        encoder = self._encoder()
        return (encoder.image_features(images) * encoder.text_features(prompts)).sum(dim=-1)
