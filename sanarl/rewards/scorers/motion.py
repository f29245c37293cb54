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
from sanarl.rewards.base import Reward, RewardInputError
from sanarl.rewards.video import check_clips
from sanarl.worlds import moving_shapes
from sanarl.worlds.shapes.captions import motion_row


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
