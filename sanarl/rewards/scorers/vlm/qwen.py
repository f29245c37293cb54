"""What the Qwen2-VL / Qwen2.5-VL rewards share: options, weights resolution, loading, video encoding, forward.

Weights: every model option is a local directory or a Hub id resolved local-first (the Hub cache, then a download
unless HF_HUB_OFFLINE is set), as the CLIP rewards do (`sanarl.rewards.weight_files`); a miss is a WeightsError
(exit code 2) naming the id and both ways to provide it. Models load with transformers' own `from_pretrained`
(`Qwen2VLForConditionalGeneration` or `Qwen2_5_VLForConditionalGeneration`, chosen by the config's model_type), the
path real and tiny test checkpoints share. Dtype `auto` = bfloat16 on a GPU, float32 on the CPU.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.model_reward import ModelReward, parse_dtype
from sanarl.rewards.video import check_clips
from sanarl.rewards.weight_files import (
    Missing,
    hub_offline,
    hub_snapshot,
    is_hub_id,
    missing_weights_error,
    no_download_reason,
    resolve_dirs,
)

INSTALL_HINT = "pip install 'sanarl[vlm]'"
MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
}
"""config.json model_type -> the transformers class that loads it."""


def require_vlm_packages(reward: str) -> Any:
    """The `transformers` module with the Qwen-VL classes and torchvision importable, else a ConfigError."""
    try:
        import torchvision  # noqa: F401  (the video processor and the frame resize need it)
        import transformers

        for name in MODEL_CLASSES.values():
            getattr(transformers, name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"reward {reward!r} needs transformers with the Qwen2-VL / Qwen2.5-VL classes and torchvision ({exc}); "
            f"install them with {INSTALL_HINT}."
        ) from None
    return transformers


def resolve_dtype(value: str | torch.dtype, device: torch.device, reward: str) -> torch.dtype:
    """`auto` -> bfloat16 on CUDA, float32 elsewhere; any other value as `parse_dtype` reads it."""
    if value == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return parse_dtype(value, reward)


def resolve_model_dir(reward: str, option: str, name: str) -> Path:
    """A local Qwen-VL model directory (config.json + weights) for `name` (path or Hub id); WeightsError else."""
    return resolve_dirs(reward, {option: (name, "model")})[option]


def resolve_files_dir(reward: str, option: str, name: str, required: Sequence[str], fix: str = "") -> Path:
    """A local directory holding every file or glob of `required` for `name` (a path or a Hub id, local-first)."""
    path = Path(name).expanduser()

    def lacking(directory: Path) -> list[str]:
        return [p for p in required if not any(directory.glob(p))]

    if path.is_dir():
        if not lacking(path):
            return path
        reason = f"directory lacks {', '.join(lacking(path))}"
    elif not is_hub_id(name):
        reason = "no such directory (and not a Hub id of the form owner/name)"
    else:
        for offline in (True, False):
            if not offline and hub_offline():
                break
            got = hub_snapshot(name, None, offline=offline)
            if got is not None and not lacking(got):
                return got
        where = no_download_reason() if hub_offline() else "the download failed"
        reason = f"not in the local Hub cache (needs {', '.join(required)}) and {where}"
    raise missing_weights_error(reward, [Missing(option, name, reason, fix)])


_models: dict[tuple[str, str, torch.dtype], Any] = {}
_models_lock = threading.Lock()


def load_vlm(directory: Path, device: torch.device, dtype: torch.dtype, reward: str) -> Any:
    """The Qwen-VL model of `directory` on `device` in `dtype`, frozen, eval mode (cached per directory/device/dtype)."""
    transformers = require_vlm_packages(reward)
    key = (str(Path(directory).resolve()), str(device), dtype)
    with _models_lock:
        if key not in _models:
            cls = getattr(transformers, MODEL_CLASSES[model_type(directory, reward)])
            try:
                model = cls.from_pretrained(str(directory), dtype=dtype)
            except (OSError, ValueError) as exc:
                raise WeightsError(
                    f"reward {reward!r}: cannot load {cls.__name__} from {directory} ({type(exc).__name__}: {exc})."
                ) from None
            _models[key] = model.to(device).eval().requires_grad_(False)
        return _models[key]


def model_type(directory: Path, reward: str) -> str:
    """config.json's model_type, checked to be a Qwen2-VL / Qwen2.5-VL one."""
    try:
        kind = json.loads((Path(directory) / "config.json").read_text())["model_type"]
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(f"reward {reward!r}: {directory}/config.json is unreadable ({exc}).") from None
    if kind not in MODEL_CLASSES:
        raise WeightsError(
            f"reward {reward!r}: {directory} holds a {kind!r} model; this reward runs on {sorted(MODEL_CLASSES)}."
        )
    return kind


def load_processor(directory: Path, reward: str, padding_side: str = "right") -> Any:
    """The model's AutoProcessor (tokenizer + image / video processors + chat template)."""
    transformers = require_vlm_packages(reward)
    try:
        processor = transformers.AutoProcessor.from_pretrained(str(directory), padding_side=padding_side)
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(
            f"reward {reward!r}: cannot load the processor of {directory} ({type(exc).__name__}: {exc})."
        ) from None
    processor.tokenizer.padding_side = padding_side
    return processor


def clear_model_cache() -> None:
    """Forget every cached Qwen-VL model."""
    with _models_lock:
        _models.clear()


def encode(
    processor: Any, texts: list[str], videos: list[torch.Tensor] | None = None, images: Any = None
) -> Any:
    """Tokenise chat texts with their videos (float `[T, 3, H, W]` in [0, 255], already sampled and sized: the
    processor neither resamples nor resizes them) into a padded batch of tensors."""
    kwargs: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
    if videos is not None:
        kwargs["videos"] = videos
        kwargs["videos_kwargs"] = {
            "do_resize": False,
            "do_sample_frames": False,
            "do_rescale": True,
            "cap_pixels_per_frame": False,
        }
    if images is not None:
        kwargs["images"] = images
        kwargs["images_kwargs"] = {"do_resize": False, "do_rescale": True}
    return processor(**kwargs)


def sequential_hidden_states(model: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden states `[B, L, D]` with the visual features in place of their pad tokens and plain sequential
    positions `0..L-1` on all three M-RoPE axes (what VideoAlign and HPSv3 trained with: their forward calls the
    language model without the multimodal rope index)."""
    inner = model.model
    ids = batch["input_ids"]
    embeds = inner.get_input_embeddings()(ids)
    for kind in ("video", "image"):
        pixels = batch.get("pixel_values_videos" if kind == "video" else "pixel_values")
        if pixels is None:
            continue
        grid = batch[f"{kind}_grid_thw"]
        getter = inner.get_video_features if kind == "video" else inner.get_image_features
        features = getter(pixels.to(inner.visual.dtype), grid)
        features = getattr(features, "pooler_output", features)
        features = torch.cat(list(features)) if isinstance(features, list | tuple) else features
        token = getattr(model.config, f"{kind}_token_id")
        mask = (ids == token).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, features.to(embeds.dtype))
    length = ids.shape[1]
    positions = torch.arange(length, device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)
    out = inner.language_model(
        inputs_embeds=embeds, attention_mask=batch["attention_mask"], position_ids=positions
    )
    return out.last_hidden_state


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor of `batch` on `device`."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def video_fps(row: Mapping[str, Any], default: float) -> float:
    """A clip's frame rate: `video_info.video_fps` (Cosmos-RL's `video_infos`), `video_fps`, else `default`."""
    info = row.get("video_info")
    value = info.get("video_fps") if isinstance(info, Mapping) else row.get("video_fps")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise RewardInputError(
            f"video_fps = {value!r} must be a positive number (frames per second of the clip)."
        )
    return float(value)


class VlmReward(ModelReward):
    """Base of the Qwen-VL rewards: `device`, `dtype` (auto | float32 | bfloat16 | float16), `batch_size`."""

    def __init__(self, device: str | torch.device | None, dtype: str | torch.dtype, batch_size: int) -> None:
        super().__init__(device, "float32" if dtype == "auto" else dtype, batch_size)
        self.dtype_option = dtype

    def model_dtype(self) -> torch.dtype:
        """The dtype the model runs in on the current device."""
        return resolve_dtype(self.dtype_option, self.device, self.name)


class VideoVlmReward(VlmReward):
    """A Qwen-VL reward of whole clips `[B, 3, T, H, W]` in [0, 1] (never frame by frame)."""

    video_native = True

    def check_input(self, images: Any) -> torch.Tensor:
        """Clips `[B, 3, T, H, W]` in [0, 1], T >= 2."""
        return check_clips(images, self.name)
