"""Scoring a batch of tasks of one reward (worker side, no Redis): pixels in, Cosmos-RL result JSON out.

Tasks of one reward taken together are scored in as few calls as possible: images of equal size are
concatenated into one `reward.score_uint8(pixels [N, 3, H, W] uint8, prompts [N], metadata [N])` call, with the
pixels as received: a reward that judges uint8 pixels (`sanarl.rewards.base.Uint8Reward`: jpeg, shapes, ocr,
geneval) scores them as they are, any other reward scores `from_uint8(pixels)` (x / 255). When a
batched call raises, each task is scored alone, so one bad request (e.g. metadata the reward rejects) fails
only itself. Videos `[B, 3, T, H, W]` are scored frame-wise as `sanarl.rewards.video.score_video` does (same
helpers, so the same numbers): every `stride`-th frame is scored with the image reward (each frame with its
clip's prompt and metadata), and each clip's frame scores are reduced by `reduction` (mean | min | max |
median; NaN when a frame is NaN). Frames of several tasks still share one scoring call. Video-native rewards
(class attribute `video_native`, e.g. `motion`, `dance_grpo`) get whole clips `[B, 3, T, H, W]` instead, clips of
equal (T, H, W) batched together; their results carry `"frames": {"whole_clip": true, "frames": T}`.

Result JSON (Cosmos-RL's, plus sanarl fields):
    {"scores": {key: [B floats, null for NaN]}, "input_info": {"shape", "dtype", "min", "max", "media_type"},
     "duration": seconds of the `score_uint8` call (for a float reward, its uint8 -> float decode included),
     "decoded_duration": 0.0, "type": reward name,
     "default_key": the reward's default key, "batch": {"tasks", "images"} of the call, "attempts": n,
     videos only: "frames": {"stride", "reduction", "scored"} (frames scored per clip)}
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sanarl.errors import UserError
from sanarl.rewards.base import Reward
from sanarl.rewards.video import frames_as_images, reduce_frames

log = logging.getLogger("reward_service.batch_scoring")


@dataclass
class Task:
    """One (request, reward) task with its decoded pixels.

    header: the stored request header (`prompts`, `metadata`, `media_type`, `shape`, `rewards`).
    array: uint8 `[B, H, W, 3]` images or `[B, 3, T, H, W]` videos.
    attempts: how many times a worker died holding this task before.
    stride, reduction: videos only: score every `stride`-th frame, reduce per clip by `reduction`.
    """

    item: str
    header: dict[str, Any]
    array: np.ndarray
    attempts: int = 0
    stride: int = 1
    reduction: str = "mean"


@dataclass
class Outcome:
    """`result` (the Cosmos-RL JSON) when scored, else `error` (a message naming the reward)."""

    result: dict[str, Any] | None = None
    error: str | None = None


def is_whole_clip(reward: Reward, task: Task) -> bool:
    """True when `task` holds videos and `reward` scores clips whole (never frame by frame)."""
    return task.header["media_type"] == "video" and bool(getattr(reward, "video_native", False))


def frames_of(task: Task, whole_clips: bool = False) -> tuple[torch.Tensor, list[str], list[dict[str, Any]]]:
    """uint8 frames `[N, 3, H, W]` with their prompts and metadata (N = B, or B * T' for videos, T' =
    ceil(T / stride) frames per clip, clip-major); with `whole_clips`, the clips `[B, 3, T, H, W]` themselves."""
    array, header = task.array, task.header
    prompts, meta = header["prompts"], header["metadata"]
    if whole_clips:
        return torch.from_numpy(array), list(prompts), list(meta)
    if header["media_type"] == "video":
        pixels, per_clip = frames_as_images(torch.from_numpy(array), task.stride)
        prompts = [p for p in prompts for _ in range(per_clip)]
        meta = [m for m in meta for _ in range(per_clip)]
    else:
        pixels = torch.from_numpy(array).permute(0, 3, 1, 2)
    return pixels, list(prompts), list(meta)


def score_tasks(reward: Reward, tasks: list[Task]) -> dict[str, Outcome]:
    """Score `tasks` of one reward; returns {queue item: Outcome}. Never raises for a task's own failure."""
    groups: dict[tuple[int, ...], list[Task]] = defaultdict(list)
    for task in tasks:
        groups[_group_key(reward, task)].append(task)
    outcomes: dict[str, Outcome] = {}
    for group in groups.values():
        try:
            outcomes.update(_score_group(reward, group))
        except Exception as exc:
            if len(group) == 1:
                outcomes[group[0].item] = Outcome(error=_describe(reward, exc))
                continue
            log.info(
                "batched call of %s failed (%s); scoring its %d tasks one by one",
                reward.name,
                exc,
                len(group),
            )
            for task in group:
                try:
                    outcomes.update(_score_group(reward, [task]))
                except Exception as single:
                    outcomes[task.item] = Outcome(error=_describe(reward, single))
    return outcomes


def _group_key(reward: Reward, task: Task) -> tuple[int, ...]:
    """Tasks with equal keys share one scoring call: (H, W) of their frames (images `[B, H, W, 3]`, videos
    `[B, 3, T, H, W]`), or (T, H, W) of whole clips."""
    shape = task.array.shape
    if is_whole_clip(reward, task):
        return (shape[2], shape[3], shape[4])
    return (shape[3], shape[4]) if task.header["media_type"] == "video" else (shape[1], shape[2])


def _describe(reward: Reward, exc: Exception) -> str:
    if not isinstance(exc, UserError):
        log.exception("reward %s raised", reward.name, exc_info=exc)
    return f"reward {reward.name!r} failed: {type(exc).__name__}: {exc}"


def _score_group(reward: Reward, group: list[Task]) -> dict[str, Outcome]:
    """One `reward.score_uint8` call over every task of `group` (frames of equal size), on the uint8 pixels."""
    parts = [frames_of(task, is_whole_clip(reward, task)) for task in group]
    pixels = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    prompts = [p for part in parts for p in part[1]]
    metadata = [m for part in parts for m in part[2]]
    start = time.perf_counter()
    scores = reward.score_uint8(pixels, prompts, metadata)
    duration = time.perf_counter() - start
    batch = {"tasks": len(group), "images": int(pixels.shape[0])}
    outcomes, offset = {}, 0
    for task, part in zip(group, parts, strict=True):
        n = int(part[0].shape[0])
        values = {key: value[offset : offset + n] for key, value in scores.items()}
        offset += n
        if task.header["media_type"] == "video" and not is_whole_clip(reward, task):
            clips = task.array.shape[0]
            values = {key: reduce_frames(value, clips, task.reduction) for key, value in values.items()}
        outcomes[task.item] = Outcome(result=_result(reward, task, values, duration, batch))
    return outcomes


def _result(
    reward: Reward, task: Task, values: dict[str, torch.Tensor], duration: float, batch: dict[str, int]
) -> dict[str, Any]:
    array = task.array
    result: dict[str, Any] = {
        "scores": {key: [_number(v) for v in value.tolist()] for key, value in values.items()},
        "input_info": {
            "shape": list(array.shape),
            "dtype": "uint8",
            "min": int(array.min()),
            "max": int(array.max()),
            "media_type": task.header["media_type"],
        },
        "duration": round(duration, 6),
        "decoded_duration": 0.0,
        "type": reward.name,
        "default_key": reward.default_key,
        "batch": batch,
        "attempts": task.attempts + 1,
    }
    infos = [row["video_info"] for row in task.header["metadata"] if "video_info" in row]
    if infos:
        result["input_info"]["video_infos"] = infos  # as Cosmos-RL echoes them
    if is_whole_clip(reward, task):
        result["frames"] = {"whole_clip": True, "frames": int(array.shape[2])}
    elif task.header["media_type"] == "video":
        scored = len(range(0, array.shape[2], task.stride))
        result["frames"] = {"stride": task.stride, "reduction": task.reduction, "scored": scored}
    return result


def _number(value: float) -> float | None:
    """JSON has no NaN / inf: non-finite scores become null (the client turns them back into NaN)."""
    return value if math.isfinite(value) else None
