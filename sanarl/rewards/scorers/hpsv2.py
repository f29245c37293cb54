"""The `hpsv2` reward: Human Preference Score v2.1 (Wu et al. 2023, "Human Preference Score v2").

    hpsv2 = normalize(image_features) . normalize(text_features)     (raw cosine, ~0.2-0.35 for real images)

HPS v2.1 is an open_clip ViT-H-14 fine-tuned on human preferences; the checkpoint `HPS_v2.1_compressed.pt` holds the
whole CLIP model (`{"state_dict": ...}`), so the architecture is built with `open_clip.create_model("ViT-H-14",
pretrained=None)` (no base weights downloaded) and the checkpoint is loaded into it, strictly. The file is read
from `<reward_ckpts>/HPS_v2.1_compressed.pt` (`$SANARL_REWARD_CKPTS`, default `./reward_ckpts`) or the `checkpoint`
option. Text: open_clip's own tokenizer for the architecture (bundled BPE vocabulary, 77 tokens, offline).

Preprocessing on tensors, as open_clip's validation transform: resize the shortest side to the model's image size
(224) bicubic, center crop, normalise with open_clip's (OpenAI) mean and std. Key: `hpsv2`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards.clip_preprocess import ImageTransform
from sanarl.rewards.model_reward import ModelReward
from sanarl.rewards.weight_files import Missing, missing_weights_error, read_state_dict, reward_ckpt_path

HPS_FILE = "HPS_v2.1_compressed.pt"
HPS_SOURCE = "the Hugging Face repository xswu/HPSv2 (`hf download xswu/HPSv2 HPS_v2.1_compressed.pt`)"
HPS_ARCH = "ViT-H-14"
INSTALL = "pip install 'sanarl[rewards]' (open_clip_torch)"


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The CLIP state dict of an HPS checkpoint: unwraps `{"state_dict": ...}` and a DDP `module.` prefix."""
    state = read_state_dict(path, "the HPS checkpoint", f"{HPS_FILE} from {HPS_SOURCE}", "a CLIP state dict")
    if not state:
        raise WeightsError(f"{path}: expected a CLIP state dict, got {type(state).__name__}.")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _architecture(name: str) -> str:
    """A built-in open_clip model name, or the stem of an open_clip model-config .json registered from disk."""
    import open_clip

    path = Path(name).expanduser()
    if name.endswith(".json"):
        if not path.is_file():
            raise ConfigError(f"reward 'hpsv2': option architecture={name!r}: no such open_clip config file.")
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"reward 'hpsv2': architecture file {name!r} is not JSON ({exc}).") from None
        if not {"embed_dim", "vision_cfg", "text_cfg"} <= set(config):
            raise ConfigError(
                f"reward 'hpsv2': {name!r} is not an open_clip model config (needs embed_dim, vision_cfg, text_cfg)."
            )
        open_clip.add_model_config(path)
        return path.stem
    if name not in open_clip.list_models():
        raise ConfigError(
            f"reward 'hpsv2': option architecture={name!r} is not an open_clip model (HPS v2.1 is {HPS_ARCH!r}); "
            "pass a built-in name or the path of an open_clip model-config .json."
        )
    return name


def build_model(architecture: str, state: Mapping[str, torch.Tensor], path: Path) -> Any:
    """An open_clip CLIP of `architecture` (float32, CPU, eval, frozen) holding `state`; WeightsError on a mismatch."""
    import open_clip

    model = open_clip.create_model(
        architecture, pretrained=None, load_weights=False, pretrained_image=False, pretrained_text=False
    )
    try:
        model.load_state_dict(dict(state), strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0:3]
        raise WeightsError(
            f"{path}: does not fit open_clip {architecture!r} ({' '.join(first)}); HPS v2.1 needs "
            f"architecture={HPS_ARCH!r} and {HPS_FILE}."
        ) from None
    return model.eval().requires_grad_(False)


class HPSv2(ModelReward):
    """HPS v2.1 score of each (image, prompt) pair; see the module doc.

    Args:
        checkpoint: the HPS file; None = `<reward_ckpts>/HPS_v2.1_compressed.pt`.
        architecture: open_clip model name (ViT-H-14) or the path of an open_clip model-config .json.
        device, dtype, batch_size (pairs per forward pass): see `ModelReward`.
    """

    name = "hpsv2"

    def __init__(
        self,
        checkpoint: str | None = None,
        architecture: str = HPS_ARCH,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        super().__init__(device, dtype, batch_size)
        self.checkpoint = checkpoint
        self.architecture = str(architecture)
        self.model: Any = None
        self.tokenizer: Any = None
        self.transform: ImageTransform | None = None

    def checkpoint_path(self) -> Path:
        """Where the HPS checkpoint is read from (see `checkpoint`)."""
        return reward_ckpt_path(self.checkpoint, HPS_FILE)

    def check_weights(self) -> Path:
        """The checkpoint file, without loading; ConfigError without open_clip, WeightsError without the file."""
        import importlib.util

        if importlib.util.find_spec("open_clip") is None:
            raise ConfigError(f"reward 'hpsv2' needs open_clip; install it with {INSTALL}.")
        path = self.checkpoint_path()
        if not path.is_file():
            fix = (
                f"Download {HPS_FILE} from {HPS_SOURCE} into {path.parent}/ (or set $SANARL_REWARD_CKPTS to its "
                "directory, or pass the reward option checkpoint=...)."
            )
            raise missing_weights_error(self.name, [Missing("checkpoint", str(path), "no such file", fix)])
        return path

    def _load(self) -> None:
        try:
            import open_clip
        except ModuleNotFoundError as exc:
            raise ConfigError(f"reward 'hpsv2' needs open_clip ({exc}); install it with {INSTALL}.") from None
        path = self.check_weights()
        arch = _architecture(self.architecture)
        model = build_model(arch, read_checkpoint(path), path)
        self.model = model.to(device=self.device, dtype=self.dtype)
        self.tokenizer = open_clip.get_tokenizer(arch)
        size = model.visual.image_size
        size = int(size[0] if isinstance(size, tuple | list) else size)
        mean = getattr(model.visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN
        std = getattr(model.visual, "image_std", None) or open_clip.OPENAI_DATASET_STD
        self.transform = ImageTransform.square(size, tuple(mean), tuple(std))  # type: ignore[arg-type]

    def features(self, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-norm float32 image and text features `[B, D]` for images `[B, 3, H, W]` in [0, 1] and B prompts."""
        assert self.model is not None and self.transform is not None
        image_out, text_out = [], []
        for start in range(0, len(prompts), self.batch_size):
            chunk = images[start : start + self.batch_size].to(self.device)
            pixels = self.transform(chunk).to(self.dtype)
            tokens = self.tokenizer(prompts[start : start + self.batch_size]).to(self.device)
            image_out.append(F.normalize(self.model.encode_image(pixels).float(), dim=-1))
            text_out.append(F.normalize(self.model.encode_text(tokens).float(), dim=-1))
        return torch.cat(image_out), torch.cat(text_out)

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] and B prompts -> `{hpsv2: [B]}` (cosine of the HPS features)."""
        image_features, text_features = self.features(images, prompts)
        return {"hpsv2": (image_features * text_features).sum(dim=-1)}
