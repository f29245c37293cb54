"""The shapes world's programmatic judge: connected components -> colour and shape -> GenEval's clauses, and the off-target image statistics (docs/shapes.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sanarl.errors import DataError
from sanarl.worlds.shapes.spec import (
    BACKGROUND,
    COVERAGE_FLOOR,
    COVERAGE_LEVEL,
    DROP_TRIANGLE,
    FG_THRESHOLD,
    FILL_CIRCLE,
    FILL_SQUARE,
    MAX_ASPECT,
    MAX_SIDE_FRAC,
    MIN_BLOB_FRAC,
    MIN_FILL,
    PALETTE,
    POSITION_THRESHOLD,
    validate_metadata,
)

# ----------------------------------------------------------------------------------------------------------------
# Judge
# ----------------------------------------------------------------------------------------------------------------


def to_float_image(image: Any) -> np.ndarray:
    """[H, W, 3] uint8 (0..255) or float (0..1) -> float64 [H, W, 3] in [0, 1].

    Raises:
        DataError: when the array is not [H, W, 3].
    """
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise DataError(
            f"The shapes judge takes one image as an [H, W, 3] array (uint8 0..255 or float 0..1); got shape "
            f"{arr.shape}. Use judge_batch for [B, 3, H, W] batches."
        )
    if arr.dtype == np.uint8:
        return arr.astype(np.float64) / 255.0
    return np.clip(arr.astype(np.float64), 0.0, 1.0)


def _label_numpy(mask: np.ndarray) -> np.ndarray:
    """8-connected labels by min-label propagation with pointer jumping; label = 1 + min raster index in the blob."""
    h, w = mask.shape
    big = h * w + 1
    labels = np.where(mask, np.arange(1, h * w + 1).reshape(h, w), big)
    while True:
        padded = np.pad(labels, 1, constant_values=big)
        nbr = np.min([padded[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)], axis=0)
        new = np.where(mask, nbr, big)
        pointed = np.append(new.reshape(-1), big)[new - 1]  # jump: the label of the pixel a label points at
        new = np.where(mask, pointed, big)
        if np.array_equal(new, labels):
            return np.where(mask, labels, 0)
        labels = new


def label_components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of a bool [H, W] mask -> (int labels [H, W], 0 = background, 1..n in raster order of
    each blob's first pixel; n). Uses scipy.ndimage when installed, else a numpy propagation (identical labels)."""
    mask = np.asarray(mask, dtype=bool)
    try:
        from scipy import ndimage
    except ImportError:  # scipy is not a dependency: fall back to the numpy propagation
        ndimage = None
    if ndimage is not None:
        labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
        return labels.astype(np.int64), int(n)
    raw = _label_numpy(mask)
    uniq = np.unique(raw[mask])
    labels = np.zeros(mask.shape, dtype=np.int64)
    labels[mask] = np.searchsorted(uniq, raw[mask]) + 1
    return labels, int(uniq.size)


@dataclass(frozen=True)
class Detection:
    """One detected object. Box in pixels (x1, y1 exclusive); shape is a SHAPES name or "other"."""

    shape: str
    color: str
    x0: int
    y0: int
    x1: int
    y1: int
    area: int
    fill: float
    drop: float

    @property
    def center(self) -> tuple[float, float]:
        return (self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2


def _dilate(mask: np.ndarray, steps: int) -> np.ndarray:
    """Binary dilation of a bool [H, W] mask by `steps` 3 x 3 (8-neighbour) steps."""
    h, w = mask.shape
    for _ in range(steps):
        padded = np.pad(mask, 1)
        mask = np.any([padded[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)], axis=0)
    return mask


def shape_features(cov: np.ndarray) -> tuple[float, float, float]:
    """(fill, drop, aspect) of a soft coverage map cov [h, w] in [0, 1] around one shape (zeros elsewhere).

    Soft extents are used because pixelisation and blur shave partly covered border rows off a thresholded box:
    width W = sum over columns of the column max, height H = sum over rows of the row max (both kept by a symmetric
    blur). fill = sum(cov) / (W * H): square 1, circle pi/4 ~ 0.79, triangle 1/2. drop = (mass centroid row - centre
    of the row-max profile) / H: the apex-up triangle's mass sits 1/6 of its height below its box centre, circles
    and squares 0. aspect = max(W, H) / min(W, H).
    """
    eps = 1e-12
    col_max, row_max, row_sum = cov.max(axis=0), cov.max(axis=1), cov.sum(axis=1)
    width, height, mass = float(col_max.sum()) + eps, float(row_max.sum()) + eps, float(row_sum.sum()) + eps
    rows = np.arange(cov.shape[0], dtype=np.float64)
    drop = (float(rows @ row_sum) / mass - float(rows @ row_max) / height) / height
    return mass / (width * height), drop, max(width, height) / min(width, height)


def classify_shape(fill: float, drop: float, aspect: float, side_frac: float = 0.0) -> str:
    """The class for shape features (side_frac = longest box side / image side): aspect > MAX_ASPECT, fill <
    MIN_FILL or side_frac > MAX_SIDE_FRAC -> "other"; drop >= DROP_TRIANGLE -> triangle; fill >= FILL_SQUARE ->
    square; fill >= FILL_CIRCLE -> circle; else triangle."""
    if aspect > MAX_ASPECT or fill < MIN_FILL or side_frac > MAX_SIDE_FRAC:
        return "other"
    if drop >= DROP_TRIANGLE:
        return "triangle"
    if fill >= FILL_SQUARE:
        return "square"
    return "circle" if fill >= FILL_CIRCLE else "triangle"


_BG = np.asarray(BACKGROUND, dtype=np.float64) / 255.0
_PAL = np.asarray(list(PALETTE.values()), dtype=np.float64) / 255.0


def _describe_blob(img: np.ndarray, blob: np.ndarray, others: np.ndarray, min_area: int) -> Detection | None:
    """Colour and shape of one blob (bool [H, W]) of img [H, W, 3]; `others` = the other blobs' pixels.

    Colour: nearest palette colour to the mean of the blob's brightest quarter (`ref`). Coverage: projection of
    each pixel on that colour (0 = background, 1 = full colour), clipped to [0, 1]. The shape mask (box, area) is
    the blob's coverage >= COVERAGE_LEVEL; None when its area is a speck. The shape features read the coverage over
    that mask grown by one pixel (minus other blobs), zeroed below COVERAGE_FLOOR: the grown pixel keeps a blurred
    edge's tail, the floor and the one-pixel limit keep pixel noise from widening the soft box.
    """
    pixels = img[blob] - _BG  # [N, 3]
    dist = np.linalg.norm(pixels, axis=1)
    ref = pixels[dist >= np.quantile(dist, 0.75)].mean(axis=0)
    color = list(PALETTE)[int(np.argmin(np.linalg.norm(_PAL - _BG - ref, axis=1)))]
    cov = np.clip((img - _BG) @ ref / max(float(ref @ ref), 1e-12), 0.0, 1.0)
    hard = blob & (cov >= COVERAGE_LEVEL)
    area = int(hard.sum())
    if area < min_area:
        return None
    ys, xs = np.nonzero(hard)
    y0, y1, x0, x1 = int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1
    zone = _dilate(hard, 1) & ~others
    soft = np.where(zone & (cov >= COVERAGE_FLOOR), cov, 0.0)
    crop = soft[max(0, y0 - 1) : y1 + 1, max(0, x0 - 1) : x1 + 1]
    fill, drop, aspect = shape_features(crop)
    side_frac = max(x1 - x0, y1 - y0) / max(img.shape[:2])
    return Detection(classify_shape(fill, drop, aspect, side_frac), color, x0, y0, x1, y1, area, fill, drop)


def min_blob_area(height: int, width: int) -> int:
    """Speck threshold in pixels: ceil(MIN_BLOB_FRAC * H * W) (6 at 32 x 32, 21 at 64 x 64)."""
    return max(1, math.ceil(MIN_BLOB_FRAC * height * width))


def detect_objects(image: Any) -> list[Detection]:
    """All objects of an [H, W, 3] image (uint8 or float in [0, 1]), in raster order of their first pixel."""
    img = to_float_image(image)
    foreground = np.linalg.norm(img - _BG, axis=2) > FG_THRESHOLD
    labels, n = label_components(foreground)
    min_area = min_blob_area(*img.shape[:2])
    areas = np.bincount(labels.reshape(-1), minlength=n + 1)
    found = []
    for k in range(1, n + 1):
        if areas[k] >= min_area:
            blob = labels == k
            det = _describe_blob(img, blob, foreground & ~blob, min_area)
            if det is not None:
                found.append(det)
    return found


def relations_between(a: Detection, b: Detection) -> set[str]:
    """Relations of a relative to b by GenEval's rule on box centres.

    offset = centre_a - centre_b; revised = sign(offset) * max(|offset| - 0.1 * (dims_a + dims_b), 0) per axis;
    (dx, dy) = revised / |offset|; "left of" if dx < -0.5, "right of" if dx > 0.5, "above" if dy < -0.5 (image y
    points down), "below" if dy > 0.5. Boxes too close for the threshold have no relation.
    """
    (ax, ay), (bx, by) = a.center, b.center
    offset = np.array([ax - bx, ay - by])
    dims = np.array([(a.x1 - a.x0) + (b.x1 - b.x0), (a.y1 - a.y0) + (b.y1 - b.y0)], dtype=np.float64)
    revised = np.sign(offset) * np.maximum(np.abs(offset) - POSITION_THRESHOLD * dims, 0.0)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    found = set()
    if dx < -0.5:
        found.add("left of")
    if dx > 0.5:
        found.add("right of")
    if dy < -0.5:
        found.add("above")
    if dy > 0.5:
        found.add("below")
    return found


@dataclass(frozen=True)
class JudgeResult:
    """Score of one image: strict (1.0 iff every clause holds), partial (fraction of clauses that hold), clauses;
    exact (1.0 iff strict and the image holds no object beyond the prompt's count, see `exact_score`)."""

    strict: float
    partial: float
    clauses: dict[str, bool]
    objects: tuple[Detection, ...] = field(default=(), repr=False)
    exact: float = 0.0
    extra_objects: int = 0
    """Detected objects minus the objects the prompt names (`prompt_object_count`; negative: too few)."""


def prompt_object_count(metadata: dict[str, Any]) -> int:
    """Objects a prompt names: the sum of its include counts ("three squares" 3, "a red circle and a blue square" 2)."""
    return sum(int(e.get("count", 1)) for e in metadata["include"])


def exact_score(strict: float, objects: Sequence[Detection], metadata: dict[str, Any]) -> float:
    """The "exact" variant of GenEval's strict score: 1.0 iff every clause holds AND the image shows exactly the
    objects the prompt names, no more (any class, "other" included; specks are not objects). GenEval's strict lets
    "a blue triangle and a green circle" pass with two more shapes beside them; exact does not."""
    return float(strict > 0 and len(objects) == prompt_object_count(metadata))


def exact_partial_score(clauses: dict[str, bool], extra_objects: int) -> float:
    """Partial credit of the exact judge: the fraction of GenEval's clauses plus one more, "no object beyond the
    prompt's count" (extra_objects <= 0), that hold. A dense reward for exact as `partial` is for strict."""
    return (sum(clauses.values()) + float(extra_objects <= 0)) / (len(clauses) + 1)


def _matches(objects: Sequence[Detection], entry: dict[str, Any]) -> list[Detection]:
    return [o for o in objects if o.shape == entry["class"] and o.color == entry.get("color", o.color)]


def evaluate_clauses(objects: Sequence[Detection], metadata: dict[str, Any]) -> dict[str, bool]:
    """GenEval's clauses over detected objects, keyed "i:class:count|color|position" and "exclude:j:class".

    count: at least `count` objects of the class; color: at least `count` of them have the colour; position: some
    object matching this entry (class and colour) and some matching the referenced entry stand in the relation;
    exclude: fewer than `count` objects of the class.
    """
    include = metadata["include"]
    clauses: dict[str, bool] = {}
    for i, entry in enumerate(include):
        key, n = f"{i}:{entry['class']}", entry.get("count", 1)
        clauses[f"{key}:count"] = sum(o.shape == entry["class"] for o in objects) >= n
        if "color" in entry:
            clauses[f"{key}:color"] = len(_matches(objects, entry)) >= n
        if "position" in entry:
            rel, ref = entry["position"]
            pairs = itertools.product(_matches(objects, entry), _matches(objects, include[ref]))
            clauses[f"{key}:position"] = any(rel in relations_between(a, b) for a, b in pairs)
    for j, entry in enumerate(metadata.get("exclude", [])):
        clauses[f"exclude:{j}:{entry['class']}"] = sum(
            o.shape == entry["class"] for o in objects
        ) < entry.get("count", 1)
    return clauses


def judge(image: Any, metadata: dict[str, Any]) -> JudgeResult:
    """Judge one image [H, W, 3] (uint8 or float in [0, 1]) against its GenEval-format metadata.

    Raises:
        DataError: invalid metadata or image shape.
    """
    validate_metadata(metadata)
    objects = detect_objects(image)
    clauses = evaluate_clauses(objects, metadata)
    partial = sum(clauses.values()) / len(clauses)
    strict = float(all(clauses.values()))
    extra = len(objects) - prompt_object_count(metadata)
    exact = exact_score(strict, objects, metadata)
    return JudgeResult(strict, float(partial), clauses, tuple(objects), exact, extra)


def batch_to_hwc(images: Any) -> np.ndarray:
    """[B, 3, H, W] float in [0, 1] or uint8 (numpy, or a torch tensor of any device / dtype) -> float64 [B, H, W, 3]
    in [0, 1]."""
    if hasattr(images, "detach"):  # torch-like, without importing torch
        images = images.detach().cpu()
        images = images.numpy() if not images.dtype.is_floating_point else images.float().numpy()
    arr = np.asarray(images)
    if arr.ndim != 4 or arr.shape[1] != 3:
        raise DataError(f"judge_batch takes images [B, 3, H, W] in [0, 1]; got shape {arr.shape}.")
    scale = 255.0 if arr.dtype == np.uint8 else 1.0
    return arr.transpose(0, 2, 3, 1).astype(np.float64) / scale


def judge_batch(images: Any, metadatas: Sequence[dict[str, Any]]) -> list[JudgeResult]:
    """Judge a batch: images [B, 3, H, W] float in [0, 1] or uint8 (numpy or torch), one metadata row per image."""
    arr = batch_to_hwc(images)
    if len(metadatas) != arr.shape[0]:
        raise DataError(
            f"judge_batch got {arr.shape[0]} images but {len(metadatas)} metadata rows; pass one each."
        )
    return [judge(img, meta) for img, meta in zip(arr, metadatas, strict=True)]


def image_stats(image: Any) -> dict[str, float]:
    """Off-target statistics of one [H, W, 3] image, to expose reward hacking.

    background_fraction: pixels within FG_THRESHOLD of BACKGROUND; num_blobs: foreground components of at least
    min_blob_area pixels; num_specks: smaller components; entropy: Shannon entropy (bits) of the colour histogram
    with 8 levels per channel (512 bins; a flat background is 0, uniform noise ~9).
    """
    img = to_float_image(image)
    foreground = np.linalg.norm(img - _BG, axis=2) > FG_THRESHOLD
    labels, n = label_components(foreground)
    areas = np.bincount(labels.reshape(-1), minlength=n + 1)[1:]
    blobs = int((areas >= min_blob_area(*img.shape[:2])).sum())
    q = np.minimum((img * 8).astype(np.int64), 7)
    hist = np.bincount((q[..., 0] * 64 + q[..., 1] * 8 + q[..., 2]).reshape(-1), minlength=512)
    p = hist[hist > 0] / hist.sum()
    return {
        "background_fraction": float(1.0 - foreground.mean()),
        "num_blobs": float(blobs),
        "num_specks": float(n - blobs),
        "entropy": float(-(p * np.log2(p)).sum()),
    }
