"""The `shapes` reward: the shapes world's programmatic judge as a reward (no weights, CPU, ~3 ms per 32 px image).

Each image is judged against its GenEval-format metadata row (forwarded by `sanarl.datasets.shapes`), or, for a
prompt without one, the row its caption states in the shapes grammar (`sanarl.worlds.shapes.captions.parse_caption`: "two red
squares", "a blue circle to the left of a yellow square"), with `shapes_world.judge`: detected objects (colour, class, box) -> GenEval's clauses (count, colour, relative position,
exclude). Keys:
- `partial` (default key): fraction of the row's clauses that hold, in [0, 1]. The denser signal for RL: a sample
  with the right shape but the wrong colour scores above an empty image, so groups rarely tie.
- `strict`: 1.0 iff every clause holds (GenEval's accuracy), 0.0 otherwise.
- `exact`: 1.0 iff strict AND the image shows no object beyond those the prompt names (`shapes_world.exact_score`):
  GenEval's strict lets extra objects pass outside counting prompts, exact does not.
- `exact_partial`: partial credit of exact, the fraction of the clauses plus "no extra object" that hold
  (`shapes_world.exact_partial_score`): a dense reward that does not pay for clutter.
- `objects`: number of detected objects (any class, including "other").
- `extra`: detected objects minus the prompt's object count (> 0: clutter beyond the prompt; < 0: missing ones).
Pixels are judged as uint8 `round(255 x)` (a `Uint8Reward`: float images go through `sanarl.rewards.base.to_uint8`,
the reward service's pixels are judged as received), so in-process and remote scores are equal. With `stats=True`
(default), off-target statistics that expose reward hacking (`shapes_world.image_stats`):
- `background`: fraction of background pixels; `specks`: foreground blobs too small to be objects;
  `entropy`: colour-histogram entropy in bits (flat background 0, uniform noise ~9).
"""

from __future__ import annotations

from typing import Any

import torch

from sanarl.errors import DataError
from sanarl.rewards.base import RewardInputError, Uint8Reward
from sanarl.worlds import shapes as world
from sanarl.worlds.shapes.captions import shapes_row

JUDGE_KEYS = ("partial", "strict", "exact", "exact_partial", "objects", "extra")
STATS_KEYS = ("background", "specks", "entropy")


def shapes_metadata(prompt: str, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The valid shapes-world row to judge `prompt` by: its metadata, else its parsed caption.

    Raises:
        RewardInputError: naming the prompt (and the grammar when the caption does not parse).
    """
    try:
        row = shapes_row(prompt, metadata)
        world.validate_metadata(row)
    except DataError as exc:
        raise RewardInputError(f"reward 'shapes': {exc}") from exc
    return row


class ShapesReward(Uint8Reward):
    """GenEval-style strict / partial credit of shapes-world images against their metadata (see module doc).

    Args:
        stats: also return the off-target statistics `background`, `specks`, `entropy`.
    """

    name = "shapes"
    keys = JUDGE_KEYS + STATS_KEYS
    default_key = "partial"

    def __init__(self, stats: bool = True) -> None:
        super().__init__()
        self.stats = bool(stats)
        self.keys = JUDGE_KEYS + (STATS_KEYS if self.stats else ())

    def _score_uint8(
        self, pixels: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Judge each uint8 image `[3, H, W]` of the batch against its row; returns `[B]` float tensors per key."""
        metadata = [shapes_metadata(p, row) for p, row in zip(prompts, metadata, strict=True)]
        values: dict[str, list[float]] = {key: [] for key in self.keys}
        for image, row in zip(world.batch_to_hwc(pixels.cpu()), metadata, strict=True):
            result = world.judge(image, row)
            values["partial"].append(result.partial)
            values["strict"].append(result.strict)
            values["exact"].append(result.exact)
            values["exact_partial"].append(world.exact_partial_score(result.clauses, result.extra_objects))
            values["objects"].append(float(len(result.objects)))
            values["extra"].append(float(result.extra_objects))
            if self.stats:
                stats = world.image_stats(image)
                values["background"].append(stats["background_fraction"])
                values["specks"].append(stats["num_specks"])
                values["entropy"].append(stats["entropy"])
        return {key: torch.tensor(vals, dtype=torch.float32) for key, vals in values.items()}

    def check_prompt(self, prompt: str, metadata: dict[str, Any]) -> None:
        shapes_metadata(prompt, metadata)
