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
"""

from __future__ import annotations

from typing import Any

import torch

from sanarl.errors import DataError
from sanarl.rewards.base import Reward, RewardInputError, check_images
from sanarl.rewards.video import frames_as_images
from sanarl.worlds import moving_shapes
from sanarl.worlds.shapes.captions import motion_row


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


class MotionReward(Reward):
    """Direction-of-motion credit of moving-shapes clips against their metadata (see the module doc)."""

    name = "motion"
    keys = ("direction", "travel", "visible")
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
        for clip, prompt, row in zip(arr, prompts, metadata, strict=True):
            direction = motion_direction(prompt, row)
            result = moving_shapes.judge_motion(clip, direction)
            values["direction"].append(result.direction)
            values["travel"].append(result.travel)
            values["visible"].append(result.visible)
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
