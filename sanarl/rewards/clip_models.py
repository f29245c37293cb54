"""Shared machinery of the CLIP-family rewards (pickscore, clipscore, aesthetic): weights, preprocessing, features.

Weights: a reward's `model` / `processor` option is a local directory (a `save_pretrained` folder) or a Hub id.
Hub ids resolve local-first: the Hub cache (`local_files_only`), then a download of only the files a CLIP model
needs unless `HF_HUB_OFFLINE` is set. When neither works, `WeightsError` names the missing ids and files and how to
provide them; nothing hangs and no hub traceback escapes. Either way the model is then loaded with
`CLIPModel.from_pretrained(<local directory>)`, the one code path real and tiny test checkpoints share.

Preprocessing runs on tensors, so gradients can flow to the images when called outside `torch.no_grad`:
images `[B, 3, H, W]` in [0, 1] -> resize the shortest side to the processor's `shortest_edge` (bicubic,
antialiased, clamped back to [0, 1]) -> center crop to `crop_size` -> `(x - mean) / std`. It matches the
transformers CLIP processor on PIL images up to the processor's uint8 rounding (exactly when no resize is needed).

Features are computed in the configured dtype on the configured device, `batch_size` samples at a time, and
returned L2-normalised in float32: `normalize(visual_projection(vision_model(x).pooler_output))` and
`normalize(text_projection(text_model(ids).pooler_output))` (Radford et al. 2021, CLIP).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards.base import Reward

MODEL_WEIGHTS_HINT = "model.safetensors or pytorch_model.bin"
MODEL_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""A CLIP model directory holds config.json and one of these."""
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""A processor directory holds one of these (transformers 4 writes the first, 5 the second)..."""
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
"""... and, when text is scored, a tokenizer: tokenizer.json, or vocab.json with merges.txt."""

_MODEL_PATTERNS = ["config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json"]
_MODEL_BIN_PATTERNS = [
    "config.json",
    "pytorch_model.bin",
    "pytorch_model-*.bin",
    "pytorch_model.bin.index.json",
]
_PROCESSOR_PATTERNS = [
    *IMAGE_PROCESSOR_FILES,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
]

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
"""Accepted values of the `dtype` option (a torch.dtype works too)."""


def reward_ckpts_dir() -> Path:
    """Directory of reward head checkpoints: `$SANARL_REWARD_CKPTS`, default `./reward_ckpts`."""
    return Path(os.environ.get("SANARL_REWARD_CKPTS", "reward_ckpts")).expanduser()


# ---------------------------------------------------------------- options


def parse_dtype(value: str | torch.dtype, reward: str) -> torch.dtype:
    """The torch dtype named by a reward's `dtype` option; ConfigError naming the choices otherwise."""
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value.lower() in DTYPES:
        return DTYPES[value.lower()]
    raise ConfigError(
        f"reward {reward!r}: option dtype={value!r} is not supported; use one of float32, bfloat16, float16 "
        "(float32 reproduces published scores, bfloat16 halves memory on GPU)."
    )


def parse_batch_size(value: Any, reward: str) -> int:
    """A positive int `batch_size` option; ConfigError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"reward {reward!r}: option batch_size={value!r} must be a positive integer (images per forward "
            "pass; lower it when the reward model runs out of memory)."
        )
    return value


def parse_device(value: str | torch.device, reward: str) -> torch.device:
    """A torch device from a reward's `device` option; ConfigError for a malformed name."""
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"reward {reward!r}: option device={value!r} is not a device ({exc}); use e.g. 'cpu' or 'cuda:0'."
        ) from None


# ---------------------------------------------------------------- weights


def _missing_files(directory: Path, kind: str) -> list[str]:
    """Names of the files `directory` lacks for `kind` ('model', 'processor' or 'image_processor')."""
    present = {p.name for p in directory.iterdir()} if directory.is_dir() else set()
    missing: list[str] = []
    if kind == "model":
        if "config.json" not in present:
            missing.append("config.json")
        if not present & set(MODEL_WEIGHT_FILES) and not any(n.startswith("model-") for n in present):
            missing.append(MODEL_WEIGHTS_HINT)
        return missing
    if not present & set(IMAGE_PROCESSOR_FILES):
        missing.append(" or ".join(IMAGE_PROCESSOR_FILES))
    if kind == "processor" and not any(set(group) <= present for group in TOKENIZER_FILES):
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    return missing


def _hub_snapshot(repo: str, patterns: list[str] | None, offline: bool) -> Path | None:
    """The Hub snapshot folder of `repo` (cache only when `offline`), or None when unavailable."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=offline))
    except Exception:
        return None


def _is_hub_id(name: str) -> bool:
    """`owner/name` (exactly one slash, not a relative or absolute path)."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no", "off")


@dataclass(frozen=True)
class Missing:
    """Why one weights entry could not be resolved (collected so that one error names all of them).

    `option` is the reward option that points at it, `name` its id or path, `fix` an extra hint (optional).
    """

    option: str
    name: str
    reason: str
    fix: str = ""


def _resolve(name: str, kind: str, option: str) -> Path | Missing:
    """A local directory with the `kind` files of `name` (a path or a Hub id), or why there is none."""
    path = Path(name).expanduser()
    if path.is_dir():
        missing = _missing_files(path, kind)
        return Missing(option, name, f"directory lacks {', '.join(missing)}") if missing else path
    if not _is_hub_id(name):
        return Missing(option, name, "no such directory (and not a Hub id of the form owner/name)")
    cached = _hub_snapshot(name, None, offline=True)
    if cached is not None and not _missing_files(cached, kind):
        return cached
    needs = ", ".join(_missing_files(cached or Path("/nonexistent"), kind))
    if _hub_offline():
        return Missing(option, name, f"not in the local Hub cache (needs {needs}) and HF_HUB_OFFLINE is set")
    if kind == "model":
        for patterns in (_MODEL_PATTERNS, _MODEL_BIN_PATTERNS):
            got = _hub_snapshot(name, patterns, offline=False)
            if got is not None and not _missing_files(got, kind):
                return got
    else:
        got = _hub_snapshot(name, _PROCESSOR_PATTERNS, offline=False)
        if got is not None and not _missing_files(got, kind):
            return got
    return Missing(option, name, f"not in the local Hub cache (needs {needs}) and the download failed")


def missing_weights_error(reward: str, missing: Sequence[Missing]) -> WeightsError:
    """One WeightsError naming every missing id / directory, its files, and both ways to provide them."""
    listed = "; ".join(f"{m.option} {m.name!r}: {m.reason}" for m in missing)
    fixes = "".join(f" {m.fix}" for m in missing if m.fix)
    repos = [m for m in missing if not m.fix]
    if not repos:
        return WeightsError(f"reward {reward!r} cannot load its weights: {listed}.{fixes}")
    hub_ids = dict.fromkeys(m.name for m in repos if _is_hub_id(m.name))
    download = " and ".join(f"`hf download {h}`" for h in hub_ids) or "`hf download <owner/name>`"
    options = " / ".join(dict.fromkeys(f"{m.option}=..." for m in repos))
    return WeightsError(
        f"reward {reward!r} cannot load its weights: {listed}. Provide the models in one of two ways: (1) on a "
        f"machine with Hub access run {download} and make that Hub cache (HF_HOME) visible here, or (2) download "
        f"each repository into a local directory and pass its path as the reward option {options}.{fixes}"
    )


def resolve_dirs(
    reward: str, wanted: Mapping[str, tuple[str, str]], also_missing: Sequence[Missing] = ()
) -> dict[str, Path]:
    """Resolve every `option -> (name, kind)` to a local directory, or raise one WeightsError naming every miss
    (including `also_missing`, e.g. a reward head file the caller looked for itself)."""
    found: dict[str, Path] = {}
    missing: list[Missing] = list(also_missing)
    for option, (name, kind) in wanted.items():
        got = _resolve(name, kind, option)
        if isinstance(got, Missing):
            missing.append(got)
        else:
            found[option] = got
    if missing:
        raise missing_weights_error(reward, missing)
    return found


# ---------------------------------------------------------------- models (loaded once per directory/device/dtype)


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


# ---------------------------------------------------------------- preprocessing


def _field(obj: Any, key: str) -> Any:
    """`obj[key]` for dicts (transformers 4 sizes), `obj.key` for SizeDict (transformers 5); None if absent."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def resize_shortest_edge(images: torch.Tensor, edge: int) -> torch.Tensor:
    """Resize `[B, 3, H, W]` so that min(H, W) == edge, keeping the aspect ratio like transformers does
    (long side -> int(edge * long / short)); bicubic, antialiased, clamped to [0, 1] (PIL clips too)."""
    height, width = images.shape[-2:]
    if min(height, width) == edge:
        return images
    if height <= width:
        size = (edge, int(edge * width / height))
    else:
        size = (int(edge * height / width), edge)
    out = F.interpolate(images, size=size, mode="bicubic", align_corners=False, antialias=True)
    return out.clamp(0.0, 1.0)


def center_crop(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Center crop `[B, C, H, W]` to `[B, C, height, width]`, offsets `(H - height) // 2` and `(W - width) // 2`;
    a side shorter than the crop is zero-padded symmetrically first (as transformers does)."""
    pad_h, pad_w = max(height - images.shape[-2], 0), max(width - images.shape[-1], 0)
    if pad_h or pad_w:
        images = F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    top = (images.shape[-2] - height) // 2
    left = (images.shape[-1] - width) // 2
    return images[..., top : top + height, left : left + width]


@dataclass(frozen=True)
class ImageTransform:
    """CLIP image preprocessing on tensors: `[B, 3, H, W]` in [0, 1] -> `[B, 3, crop_h, crop_w]` normalised.

    `shortest_edge` None = no resize; `size` (H, W) resizes to exactly that instead (processors without
    `shortest_edge`); `crop` None = no crop.
    """

    shortest_edge: int | None
    size: tuple[int, int] | None
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_processor(cls, processor: Any) -> ImageTransform:
        """Read resize / crop / normalisation settings from a transformers CLIP image processor."""
        size = processor.size if getattr(processor, "do_resize", True) else None
        edge, height, width = (_field(size, k) for k in ("shortest_edge", "height", "width"))
        crop_size = processor.crop_size if getattr(processor, "do_center_crop", True) else None
        crop = (int(_field(crop_size, "height")), int(_field(crop_size, "width"))) if crop_size else None
        normalise = getattr(processor, "do_normalize", True)
        mean = tuple(float(m) for m in processor.image_mean) if normalise else (0.0, 0.0, 0.0)
        std = tuple(float(s) for s in processor.image_std) if normalise else (1.0, 1.0, 1.0)
        return cls(
            shortest_edge=int(edge) if edge else None,
            size=(int(height), int(width)) if not edge and height and width else None,
            crop=crop,
            mean=mean,  # type: ignore[arg-type]
            std=std,  # type: ignore[arg-type]
        )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Preprocess float `[B, 3, H, W]` in [0, 1] (differentiable; computed in float32)."""
        x = images.float()
        if self.shortest_edge is not None:
            x = resize_shortest_edge(x, self.shortest_edge)
        elif self.size is not None and tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bicubic", align_corners=False, antialias=True)
            x = x.clamp(0.0, 1.0)
        if self.crop is not None:
            x = center_crop(x, *self.crop)
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std


# ---------------------------------------------------------------- features


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
        """Load from local directories (see `resolve_dirs`); the model is shared through the model cache."""
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


# ---------------------------------------------------------------- the shared reward base


class ModelReward(Reward):
    """Base of the rewards that hold a model: the shared options, parsed once with errors naming the reward.

    Args:
        device: where the model runs (None = the device given to `setup`, CPU by default).
        dtype: float32 | bfloat16 | float16 (scores are returned in float32 either way).
        batch_size: samples per forward pass.
    """

    def __init__(self, device: str | torch.device | None, dtype: str | torch.dtype, batch_size: int) -> None:
        super().__init__()
        self.dtype = parse_dtype(dtype, self.name)
        self.batch_size = parse_batch_size(batch_size, self.name)
        if device is not None:
            self.device = parse_device(device, self.name)


class ClipReward(ModelReward):
    """Base of the CLIP-family rewards: options, lazy local-first loading, one `ClipEncoder` in `self.encoder`.

    Args:
        model: CLIP model directory or Hub id.
        processor: processor (tokenizer + image preprocessing) directory or Hub id; None = `model`.
        device: where the model runs (None = the device given to `setup`, CPU by default).
        dtype: float32 | bfloat16 | float16 (features and scores are returned in float32 either way).
        batch_size: images (and prompts) per forward pass.
    """

    needs_text: bool = True

    def __init__(
        self,
        model: str,
        processor: str | None,
        device: str | torch.device | None,
        dtype: str | torch.dtype,
        batch_size: int,
    ) -> None:
        super().__init__(device, dtype, batch_size)
        self.model_name = str(model)
        self.processor_name = str(processor) if processor else self.model_name
        self.encoder: ClipEncoder | None = None

    def _load_encoder(self, also_missing: Sequence[Missing] = ()) -> ClipEncoder:
        """Resolve and load the CLIP model and processor (one WeightsError for everything missing)."""
        kind = "processor" if self.needs_text else "image_processor"
        wanted = {"model": (self.model_name, "model"), "processor": (self.processor_name, kind)}
        dirs = resolve_dirs(self.name, wanted, also_missing)
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
