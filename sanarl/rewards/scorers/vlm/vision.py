"""Qwen2-VL video input arithmetic: how many frames, which ones, and at what size (qwen-vl-utils' protocol).

The numbers follow the video path of qwen-vl-utils' `vision_process`, which VideoAlign (and the `dance_grpo`
handler of Cosmos-RL's reward service) use unchanged:

- frame count (`smart_nframes`): `nframes` when given, rounded to a multiple of FRAME_FACTOR (2); otherwise
  `T / video_fps * fps` clamped to [ceil2(min_frames), floor2(min(max_frames, T))] and rounded to a multiple of 2;
  capped at T; it must end in [2, T].
- frame indices (uniform sampling): `round(linspace(0, T - 1, nframes))` with torch's round (half to even).
- size (`smart_resize`): each side rounded to a multiple of `factor` (28 = patch 14 x merge 2); if that exceeds
  `max_pixels`, both sides are scaled by `sqrt(H W / max_pixels)` and floored to the factor; if it is below
  `min_pixels`, scaled by `sqrt(min_pixels / (H W))` and ceiled. Aspect ratios above 200 are refused.
- resampling: bicubic with antialiasing on uint8 frames (torchvision's `resize`, output rounded to uint8),
  then float in [0, 255] for the processor (which rescales by 1/255 and normalises).

Python's `round` (half to even) is used where qwen-vl-utils uses it, so the numbers agree exactly.
"""

from __future__ import annotations

import math

import torch

from sanarl.rewards.base import RewardInputError

IMAGE_FACTOR = 28
"""Sides are multiples of this (vision patch 14 x spatial merge 2)."""
FRAME_FACTOR = 2
"""Frame counts are multiples of this (the vision tower's temporal patch)."""
VIDEO_MIN_PIXELS = 128 * 28 * 28
"""Default lower bound of pixels per video frame."""
VIDEO_MAX_PIXELS = 768 * 28 * 28
"""Upper bound of pixels per frame when no `max_pixels` is given."""
VIDEO_TOTAL_PIXELS = 24576 * 28 * 28
"""Default pixel budget of a whole clip (used when no `max_pixels` is given)."""
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
MAX_RATIO = 200


def round_by_factor(number: float, factor: int) -> int:
    """The multiple of `factor` closest to `number` (Python's round: halves go to the even multiple)."""
    return round(number / factor) * factor


def ceil_by_factor(number: float, factor: int) -> int:
    """The smallest multiple of `factor` >= `number`."""
    return math.ceil(number / factor) * factor


def floor_by_factor(number: float, factor: int) -> int:
    """The largest multiple of `factor` <= `number`."""
    return math.floor(number / factor) * factor


def smart_resize(
    height: int,
    width: int,
    factor: int = IMAGE_FACTOR,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
) -> tuple[int, int]:
    """(height, width) resized to multiples of `factor` with `min_pixels <= h w <= max_pixels`, aspect kept."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise RewardInputError(
            f"frames of {height}x{width} have an aspect ratio above {MAX_RATIO}, which Qwen2-VL does not take."
        )
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = floor_by_factor(height / beta, factor)
        w_bar = floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def smart_nframes(
    total_frames: int,
    video_fps: float,
    fps: float | None = FPS,
    nframes: int | None = None,
    min_frames: int = FPS_MIN_FRAMES,
    max_frames: int | None = None,
) -> int:
    """How many frames of a `total_frames` clip at `video_fps` the model sees (see the module doc)."""
    if nframes is not None:
        count = round_by_factor(nframes, FRAME_FACTOR)
    else:
        low = ceil_by_factor(min_frames, FRAME_FACTOR)
        high = floor_by_factor(
            min(FPS_MAX_FRAMES, total_frames) if max_frames is None else max_frames, FRAME_FACTOR
        )
        wanted = total_frames / video_fps * (FPS if fps is None else fps)
        count = round_by_factor(min(max(wanted, low), high), FRAME_FACTOR)
    count = min(count, total_frames)
    if not FRAME_FACTOR <= count <= total_frames:
        raise RewardInputError(
            f"a clip of {total_frames} frames gives {count} sampled frames; Qwen2-VL video rewards need at least "
            f"{FRAME_FACTOR} frames (send clips of >= {FRAME_FACTOR} frames)."
        )
    return count


def uniform_indices(total_frames: int, nframes: int) -> list[int]:
    """`round(linspace(0, total_frames - 1, nframes))`, torch's round (half to even)."""
    return torch.linspace(0, total_frames - 1, nframes).round().long().tolist()


def video_max_pixels(
    nframes: int, min_pixels: int = VIDEO_MIN_PIXELS, total_pixels: int = VIDEO_TOTAL_PIXELS
) -> int:
    """The per-frame budget when none is given: `max(min(VIDEO_MAX_PIXELS, total / nframes * 2), 1.05 min)`."""
    return int(max(min(VIDEO_MAX_PIXELS, total_pixels / nframes * FRAME_FACTOR), int(min_pixels * 1.05)))


def resize_frames(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 frames `[T, 3, H, W]` -> float `[T, 3, height, width]` in [0, 255] (bicubic, antialiased, re-rounded
    to uint8 first, as torchvision's `resize` of a uint8 video does)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import resize

    if tuple(frames.shape[-2:]) == (height, width):
        return frames.float()
    return resize(frames, [height, width], interpolation=InterpolationMode.BICUBIC, antialias=True).float()


def to_uint8_frames(clip: torch.Tensor) -> torch.Tensor:
    """A clip `[3, T, H, W]` float in [0, 1] -> uint8 frames `[T, 3, H, W]` by `round(255 x)` (what a decoded video
    file, and the reward service's payload, hold)."""
    return (clip.detach().float() * 255.0).round().clamp(0, 255).to(torch.uint8).permute(1, 0, 2, 3).cpu()
