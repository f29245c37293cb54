"""The reward interface (docs/rewards.md): one scorer behind one small contract.

A reward maps a batch of images `[B, 3, H, W]` (float in [0, 1]) with their prompts and per-sample metadata to a
dict of score tensors `[B]` (float32, CPU, no gradient). Subclasses implement `_score`; the public `score` checks
the inputs once (layout, range, counts), runs `_score` under `torch.no_grad`, and checks and normalises the output,
so every reward - in-process or behind the reward service - honours the same contract.

Heavy rewards load their model lazily: override `_load` (called once, under a lock, on the device given to
`setup`, or on the CPU at the first `score` when `setup` was never called).

`score_uint8` takes uint8 pixels (the `round(255 x)` values the reward service receives). By default it scores
`from_uint8(pixels)`; a reward that judges uint8 pixels subclasses `Uint8Reward` and implements one core,
`_score_uint8`, which its float `score` reaches through `to_uint8`: since `to_uint8(from_uint8(u)) == u` for every
uint8 value, both entry points run the same code on the same values and give the same scores.
"""

from __future__ import annotations

import math
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from sanarl.errors import DataError

RANGE_TOLERANCE = 1e-4
"""Pixels at most this far outside [0, 1] are clamped (float round-off); anything farther is an error."""


class RewardInputError(DataError, ValueError):
    """A reward got bad input (layout, range, counts, metadata): a DataError (exit code 2) and a ValueError."""


def _layout_problem(images: Any) -> str | None:
    """Why `images` is not a float `[B, 3, H, W]` tensor, or None when it is."""
    if not isinstance(images, torch.Tensor):
        return f"got a {type(images).__name__}, not a torch.Tensor"
    shape = tuple(images.shape)
    if images.ndim != 4 or shape[1] != 3:
        hint = (
            " (channels last? use images.permute(0, 3, 1, 2))" if images.ndim == 4 and shape[3] == 3 else ""
        )
        return f"got shape {shape}{hint}"
    if shape[0] == 0:
        return "got an empty batch"
    if not images.is_floating_point():
        return f"got dtype {images.dtype} (convert uint8 with images.float() / 255)"
    return None


class _Checked(threading.local):
    """The last batch `check_images` passed on this thread: a weak reference to the tensor it returned, that
    tensor's version counter then, and whether every pixel was finite. `RewardFunction` checks a batch and hands the
    same tensor to each reward, whose `score` checks it again: the memo turns the repeat into a lookup."""

    ref: weakref.ref | None = None
    version: int = -1
    finite: bool = False


_CHECKED = _Checked()


def _remember(images: torch.Tensor, finite: bool) -> torch.Tensor:
    _CHECKED.ref, _CHECKED.version, _CHECKED.finite = weakref.ref(images), images._version, finite
    return images


def from_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels (any layout) -> float32 `x / 255`. Every value is finite and in [0, 1] by construction, so the
    result is remembered as checked: `check_images` and `Reward.score`'s finiteness test take it without reading
    the pixels again (until it is written in place). The reward service's worker decodes its requests with it."""
    if pixels.dtype != torch.uint8:
        raise TypeError(f"from_uint8 takes a uint8 tensor, got {pixels.dtype}.")
    return _remember(pixels.float().div_(255.0), True)


def known_finite(images: torch.Tensor) -> bool | None:
    """Whether every pixel of `images` is finite, when `check_images` returned this very tensor unchanged since
    (same object, same version counter: in-place writes bump it); None when it did not."""
    ref = _CHECKED.ref
    if ref is not None and ref() is images and images._version == _CHECKED.version:
        return _CHECKED.finite
    return None


def check_images(images: Any, reward: str) -> torch.Tensor:
    """Validate `images` `[B, 3, H, W]` float in [0, 1]; returns them detached, round-off clamped to [0, 1].

    Non-finite pixels are allowed here (`Reward.score` turns those samples' scores into NaN, so they are dropped
    and counted downstream). Raises RewardInputError for a wrong type, layout, dtype or range. One pass over the
    pixels (`aminmax`: NaN and infinities show in the minimum or maximum); a batch this function returned before,
    unchanged since, is not read again.
    """
    problem = _layout_problem(images)
    if problem is not None:
        raise RewardInputError(
            f"reward {reward!r} takes images as a float tensor [B, 3, H, W] with values in [0, 1]; {problem}. "
            "Pass decoded images in that layout (e.g. (vae_output / 2 + 0.5).clamp(0, 1))."
        )
    if known_finite(images) is not None:
        return images
    images = images.detach()
    low, high = (float(v) for v in images.aminmax())
    finite = math.isfinite(low) and math.isfinite(high)
    if not finite:  # slow path: range of the finite pixels only
        kept = images[torch.isfinite(images)]
        low, high = (float(kept.min()), float(kept.max())) if kept.numel() else (0.0, 1.0)
    if low < -RANGE_TOLERANCE or high > 1.0 + RANGE_TOLERANCE:
        hint = " They look like [-1, 1] images: pass (images + 1) / 2." if low < -0.5 else ""
        raise RewardInputError(
            f"reward {reward!r} takes images with values in [0, 1], got values in [{low:.4g}, {high:.4g}]; "
            f"sanarl does not rescale silently.{hint}"
        )
    return _remember(images if low >= 0.0 and high <= 1.0 else images.clamp(0.0, 1.0), finite)


def check_batch(
    images: torch.Tensor, prompts: Any, metadata: Any, reward: str
) -> tuple[list[str], list[dict[str, Any]]]:
    """Validate prompts (B strings) and metadata (None, or B dicts) against a batch of B images.

    Returns `(prompts, metadata)` as fresh lists (None metadata -> B empty dicts). Raises RewardInputError.
    """
    batch = int(images.shape[0])
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise RewardInputError(
            f"reward {reward!r} takes prompts as a list of strings, one per image; got {type(prompts).__name__}."
        )
    if len(prompts) != batch or not all(isinstance(p, str) for p in prompts):
        raise RewardInputError(
            f"reward {reward!r} got {batch} images but {len(prompts)} prompts (all must be strings); pass exactly "
            "one prompt per image (repeat a prompt once per image of its group)."
        )
    if metadata is None:
        return list(prompts), [{} for _ in range(batch)]
    if isinstance(metadata, Mapping) or not isinstance(metadata, Sequence) or len(metadata) != batch:
        count = len(metadata) if isinstance(metadata, Sequence) else type(metadata).__name__
        raise RewardInputError(
            f"reward {reward!r} got {batch} images but metadata {count}; pass a list of one dict per image "
            "(or None when the reward needs no metadata)."
        )
    if not all(isinstance(m, Mapping) for m in metadata):
        raise RewardInputError(f"reward {reward!r}: every metadata entry must be a dict, one per image.")
    return list(prompts), [dict(m) for m in metadata]


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Float pixels in [0, 1] -> uint8 by `round(255 x)`, clamped; same layout and device. The one quantisation
    of the project: the reward service's client sends these values, and in-process rewards that judge pixels
    (the shapes judge) see the same ones, so scores agree exactly both ways."""
    return _rounded_255(images).to(torch.uint8)


def _rounded_255(images: torch.Tensor) -> torch.Tensor:
    """`round(255 x)` clamped to [0, 255], still in the input's float dtype and layout (exact integers)."""
    return images.detach().mul(255.0).round_().clamp_(0, 255)


def to_uint8_channels_last(images: torch.Tensor) -> torch.Tensor:
    """`to_uint8(images)` of float `[B, C, H, W]` in [0, 1] (uint8 pixels are taken as they are), stored
    channels-last: a `[B, C, H, W]` view of a contiguous `[B, H, W, C]` buffer, so `.permute(0, 2, 3, 1)` is the
    row-major array PIL, OCR engines and the reward service's wire format take, with no copy. Same values and
    device as `to_uint8`; uint8 pixels already channels-last come back unchanged.

    Pixels stored channels-last already (a VAE decode often returns them so) keep their layout through `to_uint8`.
    Others have each channel rounded into its slot of the interleaved buffer (one strided copy per channel,
    converting on the way): on the CPU this costs about what `to_uint8` alone does, where quantising and then
    interleaving with `permute(...).contiguous()` costs ~2x."""
    if images.permute(0, 2, 3, 1).is_contiguous():
        return images if images.dtype == torch.uint8 else to_uint8(images)
    batch, channels, height, width = images.shape
    out = torch.empty((batch, height, width, channels), dtype=torch.uint8, device=images.device)
    # float pixels are rounded first, so the copy into the uint8 buffer converts exact integers
    source = images.detach() if images.dtype == torch.uint8 else _rounded_255(images)
    for channel in range(channels):
        out[..., channel].copy_(source[:, channel])
    return out.permute(0, 3, 1, 2)


def to_uint8_hwc(images: torch.Tensor) -> np.ndarray:
    """`[B, 3, H, W]` float in [0, 1] -> contiguous numpy uint8 `[B, H, W, 3]` by `round(255 x)` (what PIL
    encoders take)."""
    return to_uint8_channels_last(images).permute(0, 2, 3, 1).cpu().numpy()


def require_uint8(pixels: Any, reward: str) -> None:
    """Raise RewardInputError naming the reward unless `pixels` is a uint8 torch.Tensor."""
    if not isinstance(pixels, torch.Tensor) or pixels.dtype != torch.uint8:
        got = f"dtype {pixels.dtype}" if isinstance(pixels, torch.Tensor) else f"a {type(pixels).__name__}"
        raise RewardInputError(
            f"reward {reward!r}: score_uint8 takes uint8 pixels (round(255 x)), got {got}; pass float images in "
            "[0, 1] to score, or convert them with sanarl.rewards.base.to_uint8."
        )


def check_uint8_images(pixels: Any, reward: str) -> torch.Tensor:
    """Validate uint8 pixels `[B, 3, H, W]` (any strides: a permuted `[B, H, W, 3]` view is fine); returns them
    detached. Raises RewardInputError naming the reward for a wrong type, dtype or layout."""
    require_uint8(pixels, reward)
    shape = tuple(pixels.shape)
    if pixels.ndim != 4 or shape[1] != 3 or shape[0] == 0:
        hint = (
            " (channels last? use pixels.permute(0, 3, 1, 2))" if pixels.ndim == 4 and shape[3] == 3 else ""
        )
        raise RewardInputError(
            f"reward {reward!r} takes uint8 pixels as a tensor [B, 3, H, W] with B >= 1; got shape {shape}{hint}."
        )
    return pixels.detach()


def _normalise_output(out: Any, keys: Sequence[str], batch: int, reward: str) -> dict[str, torch.Tensor]:
    """Check that `out` holds every declared key with `[B]` values; return float32 CPU tensors."""
    if not isinstance(out, Mapping):
        raise TypeError(f"reward {reward!r} returned a {type(out).__name__}, not a dict of [B] tensors.")
    missing = [k for k in keys if k not in out]
    if missing:
        raise KeyError(f"reward {reward!r} declares keys {list(keys)} but did not return {missing}.")
    scores: dict[str, torch.Tensor] = {}
    for key, value in out.items():
        tensor = torch.as_tensor(value).detach().to("cpu", torch.float32)
        if tuple(tensor.shape) != (batch,):
            raise ValueError(
                f"reward {reward!r} returned key {key!r} with shape {tuple(tensor.shape)}, expected [{batch}]."
            )
        scores[key] = tensor
    return scores


class Reward(ABC):
    """A scorer: `score(images [B, 3, H, W] in [0, 1], prompts, metadata) -> {key: float32 CPU Tensor[B]}`.

    Class attributes: `name` (the registry name), `keys` (every key `score` returns), `default_key` (the key a
    `reward_fns` entry uses when its `score_key` is empty). A reward with one key named like itself declares only
    `name`: `keys` and `default_key` then default to it (a subclass keeps the keys it inherits). Subclasses implement `_score` on validated inputs (it
    runs under torch.no_grad) and, when they hold a model, `_load` (called once before the first score); rewards that
    judge uint8 pixels subclass `Uint8Reward` instead. `score_uint8` takes uint8 pixels (the reward service's). Instances
    are safe to call from several threads as long as `_score` is.
    """

    name: str = ""
    keys: tuple[str, ...] = ()
    default_key: str = ""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and not cls.keys:  # an alias subclass keeps the keys it inherits
            cls.keys = (cls.name,)
            cls.default_key = cls.default_key or cls.name

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self._ready = False
        self._setup_lock = threading.Lock()

    def setup(self, device: str | torch.device = "cpu") -> None:
        """Place the reward on `device` and load its model (once); later calls with another device reload."""
        device = torch.device(device)
        with self._setup_lock:
            if self._ready and device == self.device:
                return
            self.device = device
            self._load()
            self._ready = True

    def _load(self) -> None:  # noqa: B027 - optional hook, weight-free rewards need nothing
        """Load model weights onto `self.device` (heavy rewards override this)."""

    def score(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Scores `{key: Tensor[B]}` (float32, CPU) for images `[B, 3, H, W]` in [0, 1], B prompts, B metadata.

        Samples with non-finite pixels are not scored: they get NaN for every key (dropped and counted by the
        combiner). Raises RewardInputError for bad inputs.
        """
        self.check_rows(prompts, metadata)
        images = self.check_input(images)
        prompts, meta = check_batch(images, prompts, metadata, self.name)
        if not self._ready:
            self.setup(self.device)
        bad = None if known_finite(images) else ~torch.isfinite(images).flatten(1).all(dim=1)
        if bad is not None and not bool(bad.any()):
            bad = None
        if bad is not None:
            images = torch.where(bad.view(-1, *[1] * (images.ndim - 1)), torch.zeros_like(images), images)
        with torch.no_grad():
            out = self._score(images, prompts, meta)
        scores = _normalise_output(out, self.keys, images.shape[0], self.name)
        if bad is not None:
            nan, bad_cpu = torch.tensor(float("nan")), bad.cpu()
            scores = {key: torch.where(bad_cpu, nan, value) for key, value in scores.items()}
        return scores

    def score_uint8(
        self,
        pixels: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Scores of uint8 pixels `round(255 x)`: images `[B, 3, H, W]` (any strides), or clips `[B, 3, T, H, W]`
        for a video-native reward. The reward service's worker calls this with the pixels as received.

        Here: `score(from_uint8(pixels), ...)`, so rewards that judge float pixels are unchanged; `Uint8Reward`
        scores the pixels as they are. Raises RewardInputError for bad inputs, as `score` does.
        """
        require_uint8(pixels, self.name)
        return self.score(from_uint8(pixels), prompts, metadata)

    def check_rows(self, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]] | None) -> None:  # noqa: B027
        """Raise RewardInputError for prompts / metadata this reward cannot score; both entry points (`score`,
        `score_uint8`) call it first, before any model loads. Rewards that score any rows need nothing here."""

    def check_input(self, images: Any) -> torch.Tensor:
        """Validate the batch layout and range (images `[B, 3, H, W]`; video-native rewards override this)."""
        return check_images(images, self.name)

    def check_prompt(self, prompt: str, metadata: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Raise RewardInputError when this reward cannot score `prompt` with `metadata` (checked on the data
        before any model loads, `sanarl.rewards.reward_checks`); rewards that score any prompt need nothing."""

    @abstractmethod
    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> Mapping[str, Any]:
        """Scores for validated inputs: images `[B, 3, H, W]` in [0, 1] on their original device; values `[B]`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, keys={self.keys}, device={str(self.device)!r})"


class Uint8Reward(Reward):
    """A reward that judges uint8 pixels `round(255 x)` (JPEG sizes, the shapes judge, OCR, GenEval): subclasses
    implement `_score_uint8` on validated uint8 pixels. `score` quantises its float images with `to_uint8` (stored
    channels-last, `to_uint8_channels_last`: every such core reads `[H, W, 3]` rows) and calls that core;
    `score_uint8` calls it on the pixels as given, with no float round trip. Both agree exactly:
    `to_uint8(from_uint8(u)) == u`. uint8 pixels are always finite, so `score_uint8` masks nothing."""

    def score_uint8(
        self,
        pixels: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, torch.Tensor]:
        self.check_rows(prompts, metadata)
        pixels = self.check_uint8_input(pixels)
        prompts, meta = check_batch(pixels, prompts, metadata, self.name)
        if not self._ready:
            self.setup(self.device)
        with torch.no_grad():
            out = self._score_uint8(pixels, prompts, meta)
        return _normalise_output(out, self.keys, pixels.shape[0], self.name)

    def check_uint8_input(self, pixels: Any) -> torch.Tensor:
        """Validate the layout of uint8 pixels (`[B, 3, H, W]`; a video-native subclass overrides this as it
        overrides `check_input`)."""
        return check_uint8_images(pixels, self.name)

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> Mapping[str, Any]:
        return self._score_uint8(to_uint8_channels_last(images), prompts, metadata)

    @abstractmethod
    def _score_uint8(
        self, pixels: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> Mapping[str, Any]:
        """Scores for validated inputs: uint8 pixels `[B, 3, H, W]` (any strides, on their original device);
        values `[B]`."""
