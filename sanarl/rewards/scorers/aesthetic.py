"""The `aesthetic` reward: the LAION improved aesthetic predictor (Schuhmann, "improved-aesthetic-predictor").

    aesthetic = MLP(normalize(CLIP_ViT-L/14.image_features(image)))      (about 1-10, typically 5-6 for good images)

The head takes L2-normalised 768-d CLIP ViT-L/14 image embeddings: Linear(768, 1024) -> Dropout(0.2) ->
Linear(1024, 128) -> Dropout(0.2) -> Linear(128, 64) -> Dropout(0.1) -> Linear(64, 16) -> Linear(16, 1). It has no
activations (the published head is affine; its ReLUs are commented out upstream) and the dropouts are inactive at
inference. The state dict keys are `layers.{0,2,4,6,7}.{weight,bias}`, as in the published file
`sac+logos+ava1-l14-linearMSE.pth`, read from `reward_ckpts/` (or `$SANARL_REWARD_CKPTS`, or the `mlp_path`
option). The prompt is not used. Key: `aesthetic`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sanarl.errors import WeightsError
from sanarl.rewards.clip_models import ClipReward
from sanarl.rewards.weight_files import Missing, read_state_dict, reward_ckpt_path

AESTHETIC_CLIP = "openai/clip-vit-large-patch14"
AESTHETIC_FILE = "sac+logos+ava1-l14-linearMSE.pth"
AESTHETIC_SOURCE = "https://github.com/christophschuhmann/improved-aesthetic-predictor"
HIDDEN_SIZES = (1024, 128, 64, 16)


class AestheticMLP(nn.Module):
    """The LAION aesthetic head: `[B, in_dim]` unit-norm CLIP embeddings -> `[B]` scores (see module doc)."""

    def __init__(self, in_dim: int = 768) -> None:
        super().__init__()
        h1, h2, h3, h4 = HIDDEN_SIZES
        self.in_dim = in_dim
        self.layers = nn.Sequential(
            nn.Linear(in_dim, h1),
            nn.Dropout(0.2),
            nn.Linear(h1, h2),
            nn.Dropout(0.2),
            nn.Linear(h2, h3),
            nn.Dropout(0.1),
            nn.Linear(h3, h4),
            nn.Linear(h4, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """`[B, in_dim]` -> `[B]`."""
        return self.layers(embeddings).squeeze(-1)


def load_aesthetic_head(path: str | Path) -> AestheticMLP:
    """An `AestheticMLP` (eval mode, frozen, float32, CPU) with the weights of `path`; `in_dim` is read from the
    file. Raises WeightsError when the file is unreadable or its keys/shapes do not fit the head."""
    path = Path(path)
    replacement = f"the published {AESTHETIC_FILE} from {AESTHETIC_SOURCE}"
    state = read_state_dict(path, "the aesthetic head", replacement, "a state dict of the aesthetic head")
    first = state.get("layers.0.weight")
    if not isinstance(first, torch.Tensor) or first.ndim != 2:
        raise WeightsError(
            f"{path}: no 2-d tensor 'layers.0.weight', so this is not the LAION aesthetic head (found keys "
            f"{sorted(state)[:6]}); use {AESTHETIC_FILE} from {AESTHETIC_SOURCE}."
        )
    head = AestheticMLP(int(first.shape[1]))
    try:
        head.load_state_dict({k: torch.as_tensor(v).float() for k, v in state.items()})
    except RuntimeError as exc:
        raise WeightsError(f"{path}: does not fit the LAION aesthetic head: {exc}") from None
    return head.eval().requires_grad_(False)


class Aesthetic(ClipReward):
    """LAION aesthetic score of each image (prompts ignored); see the module doc.

    Args:
        model: CLIP ViT-L/14 directory or Hub id (the head was trained on its embeddings).
        mlp_path: the head file; None = `<reward_ckpts dir>/sac+logos+ava1-l14-linearMSE.pth`, where the directory
            is `$SANARL_REWARD_CKPTS` or `./reward_ckpts`.
        processor: image processor directory or Hub id (None = the model's own).
        device, dtype, batch_size: see `ClipReward` (the head always runs in float32).
    """

    name = "aesthetic"
    keys = ("aesthetic",)
    default_key = "aesthetic"
    needs_text = False

    def __init__(
        self,
        model: str = AESTHETIC_CLIP,
        mlp_path: str | None = None,
        processor: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        super().__init__(model, processor, device, dtype, batch_size)
        self.mlp_path = mlp_path
        self.head: AestheticMLP | None = None

    def head_path(self) -> Path:
        """Where the head file is read from (see `mlp_path`)."""
        return reward_ckpt_path(self.mlp_path, AESTHETIC_FILE)

    def _head_missing(self) -> list[Missing]:
        path = self.head_path()
        if path.is_file():
            return []
        fix = (
            f"Download {AESTHETIC_FILE} from {AESTHETIC_SOURCE} into {path.parent}/ (or set "
            "$SANARL_REWARD_CKPTS to its directory, or pass the reward option mlp_path=...)."
        )
        return [Missing("mlp_path", str(path), "no such file", fix)]

    def check_weights(self, also_missing: Sequence[Missing] = ()) -> dict[str, Path]:
        """The CLIP directories and the head file, without loading (one WeightsError for everything missing)."""
        return super().check_weights([*also_missing, *self._head_missing()])

    def _load(self) -> None:
        path = self.head_path()
        encoder = self._load_encoder()
        head = load_aesthetic_head(path)
        if head.in_dim != encoder.embed_dim:
            raise WeightsError(
                f"{path}: the aesthetic head takes {head.in_dim}-d embeddings but CLIP model {self.model_name!r} "
                f"gives {encoder.embed_dim}-d ones; use the CLIP the head was trained on ({AESTHETIC_CLIP})."
            )
        self.encoder, self.head = encoder, head.to(encoder.device)

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] -> `{aesthetic: [B]}`."""
        encoder = self._encoder()
        assert self.head is not None
        return {"aesthetic": self.head(encoder.image_features(images))}
