"""The moving-shapes world: captioned clips of one shape moving left / right / up / down, its renderer, its motion
judge (numpy only; the torch Dataset, the video mode of the `sanarl.datasets.shapes` plugin, is
sanarl/datasets/shapes_video.py; the `motion` reward shares the judge).

- Clip: `frames` x `size` x `size` px (16 x 16 and 8 frames for the CPU presets), the shapes world's background,
  palette and anti-aliased circle / square / triangle (`shapes_world.coverage`). One object of side
  `SIDE_RANGE * size` starts near the centre (within `START_SPREAD` of the free range along the motion axis) and
  travels in a straight line at constant speed toward the named side, covering `TRAVEL_RANGE` of the room left
  on that side and staying `MARGIN` px inside the border; the other coordinate is fixed. Starting at the centre
  (rather than anywhere on the axis) makes "moving right" also mean "ends up on the right": a frame-averaged cue
  a denoiser can learn from text before the full frame-by-frame motion (docs/video.md).
- Caption: "a {color} {shape} moving {direction}", e.g. "a red circle moving left". Metadata rows keep the shapes
  world's GenEval format (so the image `shapes` reward can judge frames) plus `"motion": direction`:
  `{"tag": "motion", "include": [{"class": "circle", "count": 1, "color": "red"}], "motion": "left", "prompt": ...}`.
- Split: the 48 (colour, shape, direction) combinations; the 7 with `(colour + shape + direction) % 6 == 0` (indices
  in PALETTE / SHAPES / DIRECTIONS order) are held out of "train" and form "test".
- Judge (`track`, `displacement`, `judge_motion`): per frame, the centroid of the foreground pixels (farther than
  `shapes_world.FG_THRESHOLD` from the background); the least-squares slope of the centroid track over the frames
  that show foreground, times (T - 1), is the displacement D = (dx, dy) in px (y down). For the asked direction u:
  `direction = (1 + cos(D, u)) / 2 * min(1, |D| / (MIN_TRAVEL * size))`: 1 for a clear move the right way, 0 for
  the reverse or for no motion, 0.5 for a clear sideways move.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from sanarl.errors import DataError
from sanarl.worlds import shapes as world

DIRECTIONS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
}
"""Direction word -> unit displacement (x right, y down)."""

SIDE_RANGE = (0.3, 0.4)
"""Object side as a fraction of the clip side."""
START_SPREAD = 0.1
"""Start of the path: the clip centre +- this fraction of the free range along the motion axis."""
TRAVEL_RANGE = (0.8, 1.0)
"""Distance travelled as a fraction of the room between the start and the named side's limit."""
MARGIN = 1.0
"""Pixels kept between the object's box and the border."""
MIN_TRAVEL = 0.15
"""Displacement (fraction of the side) at and above which a move counts fully."""


def combinations(split: str) -> list[tuple[str, str, str]]:
    """(colour, shape, direction) triples of a split ("train" or "test"), in a fixed order."""
    split = world.canonical_split(split)
    out = []
    for (ci, color), (si, shape), (di, direction) in itertools.product(
        enumerate(world.PALETTE), enumerate(world.SHAPES), enumerate(DIRECTIONS)
    ):
        held_out = (ci + si + di) % 6 == 0
        if held_out == (split == "test"):
            out.append((color, shape, direction))
    return out


def caption(color: str, shape: str, direction: str) -> str:
    return f"a {color} {shape} moving {direction}"


def metadata_row(color: str, shape: str, direction: str) -> dict[str, Any]:
    """The GenEval-format row of one combination, with the `motion` field."""
    return {
        "tag": "motion",
        "include": [{"class": shape, "count": 1, "color": color}],
        "motion": direction,
        "prompt": caption(color, shape, direction),
    }


def sample_item(split: str, seed: int, index: int) -> tuple[dict[str, Any], int]:
    """(metadata, render seed) of item `index`; a pure function of (split, seed, index)."""
    combos = combinations(split)
    rng = np.random.default_rng([seed, index, 0 if world.canonical_split(split) == "train" else 1])
    color, shape, direction = combos[int(rng.integers(len(combos)))]
    return metadata_row(color, shape, direction), int(rng.integers(2**31))


def check_direction(metadata: Any) -> str:
    """The `motion` direction of a metadata row.

    Raises:
        DataError: naming the prompt when the row has no valid `motion` field.
    """
    direction = metadata.get("motion") if isinstance(metadata, dict) else None
    if direction not in DIRECTIONS:
        prompt = metadata.get("prompt", "?") if isinstance(metadata, dict) else "?"
        raise DataError(
            f"moving-shapes metadata for prompt {prompt!r} needs `motion` in {sorted(DIRECTIONS)}, got "
            f"{direction!r}. Use rows from sanarl.datasets.shapes with policy.diffusers.is_video = true."
        )
    return direction


@dataclass(frozen=True)
class Path:
    """A straight path: object box centre at frame 0 (x0, y0), displacement per frame (vx, vy), side, all in px."""

    x0: float
    y0: float
    vx: float
    vy: float
    side: float


def plan_path(direction: str, size: int, frames: int, seed: int) -> Path:
    """A random path from near the centre toward `direction`'s side, `MARGIN` px inside a `size` px frame."""
    rng = np.random.default_rng(seed)
    side = float(rng.uniform(*SIDE_RANGE)) * size
    low, high = MARGIN + side / 2, size - MARGIN - side / 2
    ux, uy = DIRECTIONS[direction]
    sign = ux + uy  # +1 toward larger x / y, -1 toward smaller
    start = size / 2 + float(rng.uniform(-START_SPREAD, START_SPREAD)) * (high - low)
    room = high - start if sign > 0 else start - low
    step = sign * float(rng.uniform(*TRAVEL_RANGE)) * room / max(1, frames - 1)
    across = float(rng.uniform(low, high))
    if ux:
        return Path(start, across, step, 0.0, side)
    return Path(across, start, 0.0, step, side)


def render_clip(metadata: dict[str, Any], size: int = 16, frames: int = 8, seed: int = 0) -> np.ndarray:
    """Ground-truth clip of a metadata row: uint8 [T, size, size, 3]; same arguments -> same clip."""
    direction = check_direction(metadata)
    entry = metadata["include"][0]
    path = plan_path(direction, size, frames, seed)
    color = np.asarray(world.PALETTE[entry["color"]], dtype=np.float64)
    clip = np.empty((frames, size, size, 3), dtype=np.float64)
    clip[:] = world.BACKGROUND
    for t in range(frames):
        obj = world.SceneObject(
            entry["class"], entry["color"], path.x0 + t * path.vx, path.y0 + t * path.vy, path.side
        )
        rows, cols, cov = world.coverage(obj, size)
        clip[t, rows, cols] = clip[t, rows, cols] * (1 - cov[..., None]) + color * cov[..., None]
    return np.clip(np.rint(clip), 0, 255).astype(np.uint8)


def track(clip: np.ndarray) -> np.ndarray:
    """Centroid (x, y) in px of the foreground of each frame of a float clip [T, H, W, 3] in [0, 1]; NaN rows for
    frames without foreground. Pixel (r, c) has centre (c + 0.5, r + 0.5)."""
    bg = np.asarray(world.BACKGROUND, dtype=np.float64) / 255.0
    mask = np.linalg.norm(clip - bg, axis=-1) > world.FG_THRESHOLD  # [T, H, W]
    height, width = mask.shape[1:]
    ys, xs = np.mgrid[0:height, 0:width] + 0.5
    count = mask.sum(axis=(1, 2)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        cx = (mask * xs).sum(axis=(1, 2)) / count
        cy = (mask * ys).sum(axis=(1, 2)) / count
    return np.stack([cx, cy], axis=1)


def displacement(centroids: np.ndarray) -> np.ndarray:
    """Least-squares slope of the centroid track [T, 2] over its finite rows, times (T - 1): (dx, dy) in px.

    Zero when fewer than two frames show foreground."""
    frames = centroids.shape[0]
    t = np.arange(frames, dtype=np.float64)
    ok = np.isfinite(centroids).all(axis=1)
    if ok.sum() < 2:
        return np.zeros(2)
    tc = t[ok] - t[ok].mean()
    slope = (tc[:, None] * (centroids[ok] - centroids[ok].mean(axis=0))).sum(axis=0) / (tc * tc).sum()
    return slope * (frames - 1)


@dataclass(frozen=True)
class MotionResult:
    """direction score in [0, 1]; travel = signed displacement along the asked direction / side; visible = fraction
    of frames with foreground."""

    direction: float
    travel: float
    visible: float


def judge_motion(clip: np.ndarray, direction: str) -> MotionResult:
    """Score a float clip [T, H, W, 3] in [0, 1] against the asked `direction` (see the module doc)."""
    if direction not in DIRECTIONS:
        raise DataError(f"motion direction {direction!r} is not one of {sorted(DIRECTIONS)}.")
    centroids = track(clip)
    d = displacement(centroids)
    u = np.asarray(DIRECTIONS[direction])
    norm = float(np.linalg.norm(d))
    size = clip.shape[2]
    cos = float(d @ u) / norm if norm > 0 else 0.0
    score = 0.5 * (1.0 + cos) * min(1.0, norm / (MIN_TRAVEL * size)) if norm > 0 else 0.0
    visible = float(np.isfinite(centroids).all(axis=1).mean())
    return MotionResult(score, float(d @ u) / size, visible)


def check_clip_shape(size: Any, frames: Any, size_key: str, frames_key: str) -> tuple[int, int]:
    """Validate (side, frames) of moving-shapes clips: side a multiple of 8 and >= 16, frames >= 2.

    Raises:
        DataError: naming the offending key.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 16 or size % 8:
        raise DataError(
            f"`{size_key}` gives a clip side of {size!r}, but moving-shapes clips are square with a side that is a "
            f"multiple of 8 and at least 16; set `{size_key} = [16, 16]` (the CPU default)."
        )
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 2:
        raise DataError(f"`{frames_key}` = {frames!r}: a motion needs at least 2 frames; set it to 8.")
    return size, frames


# ----------------------------------------------------------------------------------------------------------------
# Dataset (the shapes plugin's video mode)
# ----------------------------------------------------------------------------------------------------------------
