"""Video rewards from image rewards: score frames, reduce over time.

A clip batch `[B, C, T, H, W]` (float in [0, 1], the layout of the reward service's video payloads) is scored by
running an image `Reward` on frames `0, stride, 2 stride, ...` of every clip at once (`[B * T', 3, H, W]`, each frame
with its clip's prompt and metadata) and reducing the per-frame scores of each clip with `mean` / `min` / `max` /
`median`. This is how DanceGRPO-style video RL applies image preference models to video.

A video-native reward (class attribute `video_native = True`: `motion`, the vision-language judges) takes the
clips themselves; `check_clips` is their input check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, get_args

import torch

from sanarl.config.choices import VideoReduction
from sanarl.rewards.base import Reward, RewardInputError, check_images

REDUCTIONS: tuple[str, ...] = get_args(VideoReduction)


def frames_as_images(videos: torch.Tensor, stride: int = 1) -> tuple[torch.Tensor, int]:
    """`[B, C, T, H, W]` -> (`[B * T', C, H, W]` with frames clip-major, T') keeping every `stride`-th frame."""
    if not isinstance(videos, torch.Tensor) or videos.ndim != 5:
        shape = tuple(videos.shape) if isinstance(videos, torch.Tensor) else type(videos).__name__
        raise RewardInputError(
            f"video rewards take clips as a float tensor [B, C, T, H, W] in [0, 1]; got {shape}. "
            "Decode the latents to frames first (the adapter's decode does)."
        )
    if stride < 1:
        raise RewardInputError(f"video_frame_stride = {stride} must be >= 1.")
    picked = videos[:, :, ::stride]
    batch, channels, frames, height, width = picked.shape
    return picked.permute(0, 2, 1, 3, 4).reshape(batch * frames, channels, height, width), frames


def check_clips(clips: Any, reward: str) -> torch.Tensor:
    """Validate clips `[B, C, T, H, W]` float in [0, 1] (C = 3, T >= 2); returns them detached and round-off clamped.

    Raises:
        RewardInputError: naming the reward, for a wrong layout, dtype or range.
    """
    if not isinstance(clips, torch.Tensor) or clips.ndim != 5 or clips.shape[2] < 2:
        shape = tuple(clips.shape) if isinstance(clips, torch.Tensor) else type(clips).__name__
        raise RewardInputError(
            f"reward {reward!r} scores video clips, a float tensor [B, C, T, H, W] in [0, 1] with T >= 2 frames; "
            f"got {shape}. Use it with a video model (policy.diffusers.is_video = true) or choose an image reward."
        )
    frames, per_clip = frames_as_images(clips)
    checked = check_images(frames, reward)  # layout, dtype and range of every frame
    batch, channels, height, width = clips.shape[0], clips.shape[1], clips.shape[3], clips.shape[4]
    return checked.reshape(batch, per_clip, channels, height, width).permute(0, 2, 1, 3, 4)


def reduce_frames(scores: torch.Tensor, batch: int, reduction: str) -> torch.Tensor:
    """Per-frame scores `[B * T']` (clip-major) -> per-clip scores `[B]` by `reduction`."""
    if reduction not in REDUCTIONS:
        raise RewardInputError(f"video_frame_reduction = {reduction!r} is not one of {REDUCTIONS}.")
    per_clip = scores.reshape(batch, -1)
    if reduction == "mean":
        return per_clip.mean(dim=1)
    if reduction == "median":
        return per_clip.median(dim=1).values
    return per_clip.amin(dim=1) if reduction == "min" else per_clip.amax(dim=1)


def score_video(
    reward: Reward,
    videos: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    stride: int = 1,
    reduction: str = "mean",
) -> dict[str, torch.Tensor]:
    """Scores `{key: Tensor[B]}` of clips `[B, C, T, H, W]` in [0, 1] by an image reward on every `stride`-th frame,
    reduced over time by `reduction`. A clip with a non-finite frame gets NaN (dropped downstream)."""
    frames, per_clip = frames_as_images(videos, stride)
    batch = int(videos.shape[0])
    if len(prompts) != batch:
        raise RewardInputError(
            f"reward {reward.name!r} got {batch} clips but {len(prompts)} prompts; pass one prompt per clip."
        )
    frame_prompts = [p for p in prompts for _ in range(per_clip)]
    frame_meta = None if metadata is None else [dict(m) for m in metadata for _ in range(per_clip)]
    scores = reward.score(frames, frame_prompts, frame_meta)
    return {key: reduce_frames(value, batch, reduction) for key, value in scores.items()}
