"""The `motion` reward: does the shape of a moving-shapes clip move the way its caption says? (no weights, CPU)

A video-native reward: it takes whole clips `[B, C, T, H, W]` in [0, 1] (class attribute `video_native = True`
tells `RewardFunction` to pass clips through instead of scoring frames one by one) and each clip's metadata row
with a `motion` direction (forwarded by `sanarl.datasets.shapes` in video mode), or for a prompt without one the
direction its caption states ("a red circle moving left", `sanarl.worlds.shapes.captions.parse_motion_caption`). The judge is
`moving_shapes.judge_motion` (centroid track -> least-squares displacement D -> `(1 + cos(D, u)) / 2` times a travel
factor). Keys:
- `direction` (default key): in [0, 1]; ~1 for ground-truth clips, ~0 for reversed or static ones, 0.5 sideways;
- `travel`: signed displacement along the asked direction as a fraction of the clip side;
- `visible`: fraction of frames that show any foreground.
Each frame is also judged as a shapes-world image (on its uint8 pixels, as the reward service receives them), so
what the direction credit does not see shows in the logs (held-out validation logs every key):
- `strict`: fraction of frames that show the named shape in the named colour (the `shapes` judge's strict);
- `exact`: fraction of frames that show it and nothing more (the judge's exact: no extra object);
- `exact_partial`: the frames' mean partial credit of exact (the `shapes` reward's key of the same name);
- `direction_exact`: `direction` times the frames' mean partial credit of "the named object and no other
  foreground": GenEval's clauses plus one more that holds when the frame has no extra object and no speck. The
  direction credit of a clip that keeps drawing the named object and nothing else, a reward that does not pay for
  texture, specks or clutter that move the centroid (the tiny-video-nft preset trains on it);
- `background`, `specks`, `entropy`: per-frame off-target statistics (`shapes` reward's keys of the same names),
  averaged over the frames: texture and speckle drawn to move the centroid lower `background` and raise `specks`.
The frame keys (and `direction_exact`) are NaN for a row with a `motion` field but no `include` whose caption is
outside the motion grammar: there is no named object to judge.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from sanarl.errors import DataError
from sanarl.rewards.base import Reward, RewardInputError, to_uint8
from sanarl.rewards.video import check_clips
from sanarl.worlds import moving_shapes
from sanarl.worlds import shapes as world
from sanarl.worlds.shapes.captions import motion_row, parse_motion_caption


class MotionReward(Reward):
    """Direction-of-motion credit of moving-shapes clips against their metadata (see the module doc)."""

    name = "motion"
    keys = (
        "direction", "travel", "visible", "direction_exact", "strict", "exact", "exact_partial",
        "background", "specks", "entropy",
    )  # fmt: skip
    default_key = "direction"
    video_native = True

    def check_input(self, images: Any) -> torch.Tensor:
        """Clips `[B, C, T, H, W]` in [0, 1] (a video-native reward); non-finite clips get NaN as in `Reward.score`."""
        return check_clips(images, self.name)

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Judge each clip `[C, T, H, W]` against its row's direction; `[B]` float tensors per key."""
        values: dict[str, list[float]] = {key: [] for key in self.keys}
        arr = images.detach().float().cpu().permute(0, 2, 3, 4, 1).double().numpy()  # [B, T, H, W, C]
        frames = to_uint8(images.detach().cpu()).permute(0, 2, 3, 4, 1).numpy()  # [B, T, H, W, C] uint8
        for clip, pixels, prompt, row in zip(arr, frames, prompts, metadata, strict=True):
            direction = motion_direction(prompt, row)
            result = moving_shapes.judge_motion(clip, direction)
            values["direction"].append(result.direction)
            values["travel"].append(result.travel)
            values["visible"].append(result.visible)
            checks = frame_checks(pixels, object_row(prompt, row))
            values["direction_exact"].append(result.direction * checks.pop("clean_partial"))
            for key, value in checks.items():
                values[key].append(value)
        return {key: torch.tensor(vals, dtype=torch.float32) for key, vals in values.items()}

    def check_prompt(self, prompt: str, metadata: dict[str, Any]) -> None:
        motion_direction(prompt, metadata)


def motion_direction(prompt: str, metadata: dict[str, Any] | None) -> str:
    """The direction to judge `prompt`'s clip by: its metadata's `motion`, else its parsed caption.

    Raises:
        RewardInputError: naming the prompt (and the grammar when the caption does not parse).
    """
    try:
        return moving_shapes.check_direction(motion_row(prompt, metadata))
    except DataError as exc:
        raise RewardInputError(f"reward 'motion': {exc}") from exc


def object_row(prompt: str, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The shapes-world row a clip's frames are judged by: its metadata when it names the object (`include`), else
    its parsed motion caption; None when neither does (a row with a `motion` field only and a free caption)."""
    if metadata and "include" in metadata:
        return metadata
    return parse_motion_caption(prompt)


def frame_checks(frames: np.ndarray, row: dict[str, Any] | None) -> dict[str, float]:
    """Frames `[T, H, W, 3]` uint8 of one clip judged as shapes-world images against `row`: the fraction of frames
    strict and exact hold on, the mean exact_partial and clean_partial (exact_partial whose "nothing more" also
    needs no speck; all four NaN without a row), and the frames' mean background fraction, specks and entropy."""
    judged = [world.judge(frame, row) for frame in frames] if row is not None else []
    stats = [world.image_stats(frame) for frame in frames]
    clean = [
        world.exact_partial_score(
            j.clauses, j.extra_objects if st["num_specks"] == 0 else max(1, j.extra_objects)
        )
        for j, st in zip(judged, stats, strict=False)
    ]

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else math.nan

    return {
        "strict": mean([j.strict for j in judged]),
        "exact": mean([j.exact for j in judged]),
        "exact_partial": mean([world.exact_partial_score(j.clauses, j.extra_objects) for j in judged]),
        "clean_partial": mean(clean),
        "background": float(np.mean([s["background_fraction"] for s in stats])),
        "specks": float(np.mean([s["num_specks"] for s in stats])),
        "entropy": float(np.mean([s["entropy"] for s in stats])),
    }
