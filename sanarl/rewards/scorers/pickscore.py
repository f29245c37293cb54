"""The `pickscore` reward: PickScore v1 (Kirstain et al. 2023, "Pick-a-Pic"), a CLIP-H fine-tuned on human
preferences.

    pickscore_raw = exp(logit_scale) * cos(image_embedding, text_embedding)   (the published eval scale, ~17-23)
    pickscore = pickscore_raw / 26                                             (the RL training scale, ~0.65-0.9)

Model `yuvalkirstain/PickScore_v1` (a transformers CLIPModel) with the processor of
`laion/CLIP-ViT-H-14-laion2B-s32B-b79K` (224 px shortest edge, center crop, CLIP mean/std), as in the reference
code. Keys: `pickscore` (default) and `pickscore_raw`. Images are preprocessed on tensors (see clip_preprocess).
"""

from __future__ import annotations

from typing import Any

import torch

from sanarl.rewards.clip_models import ClipReward

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
TRAINING_DIVISOR = 26.0
"""pickscore = pickscore_raw / this (the scale Flow-GRPO and DiffusionNFT train on)."""


class PickScore(ClipReward):
    """PickScore of each (image, prompt) pair; see the module doc for the formula and scales.

    Options (see `ClipReward`): model (default the PickScore model), processor (default the CLIP-H processor),
    device, dtype, batch_size (32).
    """

    name = "pickscore"
    keys = ("pickscore", "pickscore_raw")
    default_key = "pickscore"
    model_default = PICKSCORE_MODEL
    processor_default = PICKSCORE_PROCESSOR

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] and B prompts -> `{pickscore, pickscore_raw}`, each `[B]`."""
        raw = self._encoder().logit_scale * self.similarity(images, prompts)
        return {"pickscore": raw / TRAINING_DIVISOR, "pickscore_raw": raw}
