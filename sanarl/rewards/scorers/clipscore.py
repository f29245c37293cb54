"""The `clipscore` reward: cosine similarity of CLIP ViT-L/14 image and text embeddings (Radford et al. 2021).

    clipscore = cos(image_embedding, text_embedding) = logits_per_image / 100   (OpenAI CLIP's logit scale is 100)

in [-1, 1], about 0.2-0.35 for matching pairs. Model `openai/clip-vit-large-patch14` (transformers CLIPModel and
its own processor). Key: `clipscore`. Images are preprocessed on tensors (see clip_preprocess).
"""

from __future__ import annotations

from typing import Any

import torch

from sanarl.rewards.clip_models import ClipReward

CLIPSCORE_MODEL = "openai/clip-vit-large-patch14"


class ClipScore(ClipReward):
    """Cosine similarity between each image and its prompt in CLIP space.

    Options (see `ClipReward`): model (default `openai/clip-vit-large-patch14`), processor (default: the model's
    own), device, dtype, batch_size (32).
    """

    name = "clipscore"
    keys = ("clipscore",)
    default_key = "clipscore"
    model_default = CLIPSCORE_MODEL

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] and B prompts -> `{clipscore: [B]}` in [-1, 1]."""
        return {"clipscore": self.similarity(images, prompts)}
