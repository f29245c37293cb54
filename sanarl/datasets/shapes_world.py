"""The shapes world: a GenEval-like captioned-shapes dataset, its deterministic renderer and its programmatic judge.

Everything here is numpy + PIL (no torch), so the reward, the bench and the dataset plugin share one definition.
The full specification with examples and measured judge accuracy is docs/shapes.md; the summary:

- Image: square, `size` x `size` px (32 by default, 64, or any multiple of 16 >= 32); every length scales with size.
  Plain near-black background `BACKGROUND`; `PALETTE` holds four saturated, well separated colours.
- Objects: filled, upright, axis-aligned circle / square / triangle whose bounding box is a square of side `s`
  (circle diameter s; square side s; triangle base s and height s, apex up). `s` depends on how many objects the
  scene holds (`SIZE_RANGES`); bounding boxes keep a gap of at least `GAP_FRAC * size` and a margin of
  `MARGIN_FRAC * size` to the border, so objects never touch.
- Prompts: GenEval's six categories (tags) and its JSONL metadata format, e.g.
  `{"tag": "position", "include": [{"class": "square", "count": 1, "color": "blue"},
  {"class": "circle", "count": 1, "color": "red", "position": ["left of", 0]}], "prompt": "a red circle to the left
  of a blue square"}`; `position: [relation, j]` places that entry relative to include entry j.
- Split of prompt *combinations* (`split_of`): held-out colour-shape pairs, held-out (shape, shape, relation)
  layouts (mirror-closed), held-out counts per shape and the reversed word order of two_object prompts never occur
  in "train" captions. Unspecified attributes (e.g. the colour in "a circle") are drawn from the whole palette.
- Judge (`judge`): connected components of non-background pixels -> colour (nearest palette colour) and shape
  (soft fill ratio and centroid drop of the blob's coverage map) -> GenEval's clauses (count >= n, colour, relative position of box
  centres with GenEval's 0.1 threshold, exclude < n). strict = all clauses hold, partial = fraction that hold.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sanarl.errors import DataError

# ----------------------------------------------------------------------------------------------------------------
# World specification
# ----------------------------------------------------------------------------------------------------------------

BACKGROUND: tuple[int, int, int] = (16, 16, 16)
"""Background RGB (near-black)."""

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 215, 40),
}
"""Colour names -> RGB. Smallest pairwise RGB distance 175 (red-yellow); smallest distance to the background 181
(green)."""

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
"""Object classes, in the canonical order used for two_object prompts."""

RELATIONS: dict[str, str] = {
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
}
"""GenEval relation name (metadata) -> caption phrase."""

TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""GenEval categories."""

NUMBER_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three", 4: "four"}
COUNTS: tuple[int, ...] = (2, 3, 4)
"""Counts of the counting category (one object is single_object)."""

MAX_OBJECTS = 4
"""Most objects a scene can hold (the layout guarantees wide gaps up to this many)."""

SIZE_RANGES: dict[int, tuple[float, float]] = {
    1: (0.38, 0.55),
    2: (0.28, 0.36),
    3: (0.24, 0.32),
    4: (0.22, 0.28),
}
"""Objects in the scene -> range of the side `s` as a fraction of the image size (uniform per object)."""

GAP_FRAC = 0.125
"""Minimum gap between two objects' bounding boxes (along x or along y), fraction of the image size (4 px at 32)."""
MARGIN_FRAC = 0.0625
"""Minimum distance of a bounding box to the image border, fraction of the image size (2 px at 32)."""
ORTHO_FRAC = 0.3
"""Related pairs: |offset across the relation axis| <= ORTHO_FRAC * offset along it (unambiguous layouts)."""

HELDOUT_COLOR_SHAPES: frozenset[tuple[str, str]] = frozenset(
    {("green", "circle"), ("blue", "square"), ("yellow", "triangle")}
)
"""(colour, class) pairs that no train caption mentions."""
HELDOUT_LAYOUTS: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("circle", "left of", "square"),
        ("square", "right of", "circle"),
        ("triangle", "above", "circle"),
        ("circle", "below", "triangle"),
        ("square", "above", "triangle"),
        ("triangle", "below", "square"),
    }
)
"""(positioned class, relation, reference class) never in train captions; closed under mirroring, so the spatial
arrangement itself is unseen (not just its wording)."""
HELDOUT_COUNTS: frozenset[tuple[str, int]] = frozenset({("circle", 4), ("square", 3), ("triangle", 2)})
"""(class, count) pairs of counting prompts that no train caption uses."""

SPLITS: tuple[str, ...] = ("train", "test")
SPLIT_ALIASES: dict[str, str] = {"train": "train", "test": "test", "heldout": "test", "held-out": "test"}

# Judge thresholds (all documented in docs/shapes.md).
FG_THRESHOLD = 0.2
"""A pixel is foreground when its RGB distance to BACKGROUND (values in [0, 1]) exceeds this."""
COVERAGE_FLOOR = 0.15
"""Coverage below this is set to 0 before the shape features (pixel noise must not widen the soft box)."""
COVERAGE_LEVEL = 0.5
"""Within a blob, pixels whose estimated coverage (projection on the blob colour) is >= this form the shape mask."""
MIN_BLOB_FRAC = 0.005
"""Blobs smaller than this fraction of the image (6 px at 32, 21 px at 64) are specks and ignored."""
DROP_TRIANGLE = 0.04
"""Mass centroid this far (fraction of the height) below the box centre -> triangle (ideal triangle 1/6)."""
FILL_SQUARE = 0.865
"""Soft fill ratio (coverage mass / soft box area, see `shape_features`) >= this -> square."""
FILL_CIRCLE = 0.68
"""Soft fill ratio >= this (and below FILL_SQUARE) -> circle; below -> triangle, unless below MIN_FILL."""
MIN_FILL = 0.3
"""Fill ratio below this -> "other" (not a world shape)."""
MAX_ASPECT = 1.5
MAX_SIDE_FRAC = 0.7
"""A shape box longer than this fraction of the image side -> "other" (world objects reach 0.55)."""
"""Soft box aspect ratio (long / short side) above this -> "other"."""
POSITION_THRESHOLD = 0.1
"""GenEval's relative-position threshold (fraction of the summed box dimensions)."""

# ----------------------------------------------------------------------------------------------------------------
# Metadata validation
# ----------------------------------------------------------------------------------------------------------------


def _bad(metadata: Any, problem: str) -> DataError:
    """A DataError naming the offending metadata row and the format to use."""
    prompt = metadata.get("prompt", "?") if isinstance(metadata, dict) else "?"
    return DataError(
        f"Shapes metadata for prompt {prompt!r} is invalid: {problem}. Rows use GenEval's format "
        '{"tag": ..., "include": [{"class": circle|square|triangle, "count": int >= 1 (default 1), "color"?: '
        f'{"|".join(PALETTE)}, "position"?: [relation, include index]}}], "exclude"?: [...], "prompt": ...}} '
        f"with relations {list(RELATIONS)}; fix the row or regenerate it with sanarl.datasets.shapes_world."
    )


def _check_entry(metadata: dict, entry: Any, where: str, n_include: int, index: int) -> None:
    """Validate one include / exclude entry (class, count, optional colour and position)."""
    if not isinstance(entry, dict):
        raise _bad(metadata, f"{where} is not an object")
    if entry.get("class") not in SHAPES:
        raise _bad(metadata, f"{where}.class is {entry.get('class')!r}, not one of {list(SHAPES)}")
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise _bad(metadata, f"{where}.count is {count!r}, not an integer >= 1")
    if "color" in entry and entry["color"] not in PALETTE:
        raise _bad(metadata, f"{where}.color is {entry['color']!r}, not one of {list(PALETTE)}")
    if "position" in entry:
        pos = entry["position"]
        ok = isinstance(pos, (list, tuple)) and len(pos) == 2 and pos[0] in RELATIONS
        ok = ok and isinstance(pos[1], int) and 0 <= pos[1] < n_include and pos[1] != index
        if not ok:
            raise _bad(
                metadata, f"{where}.position is {pos!r}, not [relation, index of another include entry]"
            )


def validate_metadata(metadata: Any) -> None:
    """Check a GenEval-format metadata row against the shapes world.

    Raises:
        DataError: naming the prompt and the offending field.
    """
    if (
        not isinstance(metadata, dict)
        or not isinstance(metadata.get("include"), list)
        or not metadata["include"]
    ):
        raise _bad(metadata, 'it needs a non-empty "include" list')
    n = len(metadata["include"])
    for i, entry in enumerate(metadata["include"]):
        _check_entry(metadata, entry, f"include[{i}]", n, i)
    excludes = metadata.get("exclude", [])
    if not isinstance(excludes, list):
        raise _bad(metadata, '"exclude" is not a list')
    for i, entry in enumerate(excludes):
        _check_entry(metadata, entry, f"exclude[{i}]", n, -1)
        if "position" in entry:
            raise _bad(metadata, f"exclude[{i}] has a position")


# ----------------------------------------------------------------------------------------------------------------
# Captions, prompt sets and the train / held-out split
# ----------------------------------------------------------------------------------------------------------------


def _obj(shape: str, count: int = 1, color: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"class": shape, "count": count}
    if color is not None:
        entry["color"] = color
    return entry


def _row(tag: str, include: list[dict], prompt: str, exclude: list[dict] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"tag": tag, "include": include}
    if exclude:
        row["exclude"] = exclude
    row["prompt"] = prompt
    return row


def _category_rows(tag: str) -> list[dict[str, Any]]:
    """Every prompt of one category, in a fixed order (the caption templates of docs/shapes.md)."""
    colors, pairs = list(PALETTE), list(itertools.permutations(SHAPES, 2))
    if tag == "single_object":
        return [_row(tag, [_obj(s)], f"a {s}") for s in SHAPES]
    if tag == "two_object":
        return [_row(tag, [_obj(a), _obj(b)], f"a {a} and a {b}") for a, b in pairs]
    if tag == "counting":
        return [
            _row(tag, [_obj(s, n)], f"{NUMBER_WORDS[n]} {s}s", exclude=[_obj(s, n + 1)])
            for s in SHAPES
            for n in COUNTS
        ]
    if tag == "colors":
        return [_row(tag, [_obj(s, 1, c)], f"a {c} {s}") for s in SHAPES for c in colors]
    if tag == "color_attr":
        return [
            _row(tag, [_obj(a, 1, ca), _obj(b, 1, cb)], f"a {ca} {a} and a {cb} {b}")
            for a, b in pairs
            for ca in colors
            for cb in colors
        ]
    if tag == "position":
        rows = []
        for (a, b), rel, ca, cb in itertools.product(pairs, RELATIONS, colors, colors):
            moved = {**_obj(a, 1, ca), "position": [rel, 0]}
            rows.append(_row(tag, [_obj(b, 1, cb), moved], f"a {ca} {a} {RELATIONS[rel]} a {cb} {b}"))
        return rows
    raise ValueError(f"unknown tag {tag!r}")


def split_of(metadata: dict[str, Any]) -> str:
    """ "train" or "test" (held-out) for a metadata row, by the combinations its caption states.

    Held out: any (colour, class) in HELDOUT_COLOR_SHAPES; any (class, relation, reference class) in
    HELDOUT_LAYOUTS; counting rows whose (class, count) is in HELDOUT_COUNTS; two_object rows whose classes are not
    in the canonical SHAPES order (e.g. "a square and a circle"). Everything else is train.
    """
    include = metadata["include"]
    if any((e.get("color"), e["class"]) in HELDOUT_COLOR_SHAPES for e in include):
        return "test"
    for e in include:
        if "position" in e:
            rel, ref = e["position"]
            if (e["class"], rel, include[ref]["class"]) in HELDOUT_LAYOUTS:
                return "test"
    tag = metadata.get("tag")
    if tag == "counting" and (include[0]["class"], include[0].get("count", 1)) in HELDOUT_COUNTS:
        return "test"
    if tag == "two_object" and SHAPES.index(include[0]["class"]) > SHAPES.index(include[1]["class"]):
        return "test"
    return "train"


def canonical_split(split: str, key: str = "split") -> str:
    """Map a split name (train | test | heldout) to "train" or "test".

    Raises:
        DataError: naming `key` when the name is unknown.
    """
    name = SPLIT_ALIASES.get(str(split).strip().lower())
    if name is None:
        raise DataError(
            f'`{key}` is {split!r}, which the shapes world does not have. Use "train" (seen combinations) or '
            '"test" (alias "heldout": held-out combinations), e.g. `--set ' + key + '="test"`.'
        )
    return name


@functools.cache
def _split_table() -> dict[str, dict[str, tuple[dict[str, Any], ...]]]:
    table: dict[str, dict[str, list]] = {s: {} for s in SPLITS}
    for tag in TAGS:
        for row in _category_rows(tag):
            table[split_of(row)].setdefault(tag, []).append(row)
    return {s: {t: tuple(rows) for t, rows in cats.items()} for s, cats in table.items()}


def list_prompts(split: str) -> dict[str, list[dict[str, Any]]]:
    """All prompts of a split grouped by tag: {tag: [metadata, ...]} (fresh copies; tags without prompts absent).

    Sizes: train {single_object 3, two_object 3, counting 6, colors 9, position 162, color_attr 54};
    test {two_object 3, counting 3, colors 3, position 222, color_attr 42}.
    """
    cats = _split_table()[canonical_split(split)]
    return {tag: copy.deepcopy(list(rows)) for tag, rows in cats.items()}


def all_splits() -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Both splits: {"train": list_prompts("train"), "test": list_prompts("test")}; their prompts are disjoint."""
    return {s: list_prompts(s) for s in SPLITS}


def caption_vocabulary() -> list[str]:
    """Sorted distinct words of every caption in both splits (22 words), e.g. for a word-level tokenizer."""
    rows = (m for split in _split_table().values() for cat in split.values() for m in cat)
    return sorted({word for m in rows for word in m["prompt"].split()})


def sample_item(split: str, seed: int, index: int) -> tuple[dict[str, Any], int]:
    """Item `index` of a split: (metadata, render seed), a pure function of (split, seed, index).

    The tag is uniform over the split's categories, then the prompt is uniform within the tag; the render seed is a
    31-bit integer from the same stream (numpy PCG64 seeded with [split id, seed, index]).
    """
    name = canonical_split(split)
    cats = _split_table()[name]
    rng = np.random.default_rng([SPLITS.index(name), int(seed) % 2**63, int(index)])
    tag = sorted(cats, key=TAGS.index)[int(rng.integers(len(cats)))]
    rows = cats[tag]
    metadata = copy.deepcopy(rows[int(rng.integers(len(rows)))])
    return metadata, int(rng.integers(2**31))


# ----------------------------------------------------------------------------------------------------------------
# Scene layout and rendering
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SceneObject:
    """One object in pixel units: its bounding box is [cx - size/2, cx + size/2] x [cy - size/2, cy + size/2]."""

    shape: str
    color: str
    cx: float
    cy: float
    size: float


def check_image_size(size: Any, key: str = "size") -> int:
    """Validate an image side (an int multiple of 16, >= 32).

    Raises:
        DataError: naming `key`.
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 32 or size % 16:
        raise DataError(
            f"`{key}` is {size!r}, but the shapes world renders square images whose side is a multiple of 16 and "
            "at least 32 (32 is the CPU default, 64 the larger variant). Set it to 32 or 64."
        )
    return int(size)


def _slots(metadata: dict[str, Any], rng: np.random.Generator) -> tuple[list[tuple[str, str]], list[tuple]]:
    """Expand include entries into (class, colour) object slots and (slot a, relation, slot b, strict) constraints;
    strict = False only separates the boxes along the axis (no ORTHO_FRAC bound)."""
    slots, first = [], []
    for entry in metadata["include"]:
        first.append(len(slots))
        for _ in range(entry.get("count", 1)):
            color = entry.get("color") or list(PALETTE)[int(rng.integers(len(PALETTE)))]
            slots.append((entry["class"], color))
    relations = []
    for i, entry in enumerate(metadata["include"]):
        if "position" in entry:
            rel, ref = entry["position"]
            if entry.get("count", 1) != 1 or metadata["include"][ref].get("count", 1) != 1:
                raise _bad(metadata, f"include[{i}] has a position but it or its reference has count != 1")
            relations.append((first[i], rel, first[ref], True))
    if not 1 <= len(slots) <= MAX_OBJECTS:
        raise _bad(metadata, f"it asks for {len(slots)} objects; a scene holds 1..{MAX_OBJECTS}")
    if len(slots) == 2 and not relations:  # side by side along a random axis: two large boxes always fit
        relations.append((0, list(RELATIONS)[int(rng.integers(len(RELATIONS)))], 1, False))
    return slots, relations


def _relation_ok(
    pa: np.ndarray, pb: np.ndarray, rel: str, sides: tuple[float, float], gap: float, strict: bool = True
) -> np.ndarray:
    """Layout test of "a <rel> b" for centres pa, pb ([T, 2] or [2], (x, y) px) and sides (side_a, side_b): along
    the relation axis the boxes are apart by >= gap, and (strict) the offset across it is <= ORTHO_FRAC times the
    offset along it."""
    d = np.atleast_2d(pb - pa)  # reference minus positioned object
    along = {"left of": d[:, 0], "right of": -d[:, 0], "above": d[:, 1], "below": -d[:, 1]}[rel]
    across = d[:, 1] if rel in ("left of", "right of") else d[:, 0]
    ok = along >= (sides[0] + sides[1]) / 2 + gap
    return ok & (np.abs(across) <= ORTHO_FRAC * along) if strict else ok


def _bounds(k: int, sides: np.ndarray, relations: list[tuple], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Range [low, high] (x, y) of object k's centre: inside the margin, and leaving room along each relation axis
    for a partner placed after k (so a related pair placed in order always fits)."""
    margin, gap = MARGIN_FRAC * size, GAP_FRAC * size
    low, high = np.full(2, margin + sides[k] / 2), np.full(2, size - margin - sides[k] / 2)
    for a, rel, b, _ in relations:
        if k not in (a, b) or max(a, b) == k:
            continue
        other = b if k == a else a
        room = sides[other] + gap
        axis = 0 if rel in ("left of", "right of") else 1
        # k needs room on the side where its later partner goes: "a left of b" puts a at smaller x than b.
        partner_lower = (rel in ("left of", "above")) == (other == a)
        if partner_lower:
            low[axis] = max(low[axis], margin + room + sides[k] / 2)
        else:
            high[axis] = min(high[axis], size - margin - room - sides[k] / 2)
    return low, high


def _place(
    sides: np.ndarray, relations: list[tuple], size: int, rng: np.random.Generator
) -> np.ndarray | None:
    """Centres [n, 2] (x, y) px placed one object at a time, or None when an object finds no spot.

    Object k takes the first of 256 uniform candidates in `_bounds` that keeps the gap to every placed object and
    every relation whose two objects are then placed.
    """
    gap = GAP_FRAC * size
    placed = np.zeros((len(sides), 2))
    for k, side in enumerate(sides):
        low, high = _bounds(k, sides, relations, size)
        cand = low + rng.random((256, 2)) * np.maximum(high - low, 0.0)
        ok = np.ones(len(cand), dtype=bool)
        for i in range(k):
            free = np.abs(cand - placed[i]) - (sides[i] + side) / 2  # gaps along x and y
            ok &= free.max(axis=1) >= gap
        for a, rel, b, strict in relations:
            if max(a, b) == k:
                pa, pb = (cand, placed[b]) if a == k else (placed[a], cand)
                ok &= _relation_ok(pa, pb, rel, (sides[a], sides[b]), gap, strict)
        if not ok.any():
            return None
        placed[k] = cand[int(np.argmax(ok))]
    return placed


def plan_scene(metadata: dict[str, Any], size: int = 32, seed: int = 0) -> list[SceneObject]:
    """Objects (class, colour, centre, side) for a metadata row: a pure function of (metadata, size, seed).

    Sides are uniform in SIZE_RANGES[n] * size; objects are placed one at a time (`_place`) keeping bounding-box
    gaps >= GAP_FRAC * size, margins >= MARGIN_FRAC * size and every relation (boxes apart along its axis by the
    gap, offset across <= ORTHO_FRAC * offset along); a failed scene is redrawn, and every 50 failures shrink the
    sides by 5% (a guarantee of termination; the shipped ranges practically never need it).

    Raises:
        DataError: invalid metadata, more than MAX_OBJECTS objects, contradictory positions, or a bad size.
    """
    size = check_image_size(size)
    validate_metadata(metadata)
    rng = np.random.default_rng([int(seed) % 2**63, size])
    slots, relations = _slots(metadata, rng)
    lo, hi = SIZE_RANGES[len(slots)]
    sides = rng.uniform(lo, hi, len(slots)) * size
    for attempt in range(1, 1001):
        centers = _place(sides, relations, size, rng)
        if centers is not None:
            return [
                SceneObject(shape, color, float(centers[k, 0]), float(centers[k, 1]), float(sides[k]))
                for k, (shape, color) in enumerate(slots)
            ]
        if attempt % 50 == 0:
            sides = sides * 0.95
    raise _bad(metadata, f"no layout at size {size} satisfies its positions (are they contradictory?)")


def _inside(shape: str, u: np.ndarray, v: np.ndarray, half: float) -> np.ndarray:
    """Point-in-shape test, (u, v) = offsets from the centre (v down), half = side / 2."""
    if shape == "circle":
        return u * u + v * v <= half * half
    if shape == "square":
        return (np.abs(u) <= half) & (np.abs(v) <= half)
    # Upright isosceles triangle: apex (0, -half), base from (-half, half) to (half, half).
    return (v >= -half) & (v <= half) & (np.abs(u) <= (v + half) / 2)


def coverage(obj: SceneObject, size: int, supersample: int = 4) -> tuple[slice, slice, np.ndarray]:
    """Anti-aliased coverage of one object: (rows, cols, cov [h, w] in [0, 1]) over its bounding-box pixels.

    Pixel (r, c) spans [c, c+1) x [r, r+1); coverage is the fraction of its supersample x supersample grid points
    (at offsets (k + 0.5) / supersample) inside the shape.
    """
    half = obj.size / 2
    r0, r1 = max(0, math.floor(obj.cy - half)), min(size, math.ceil(obj.cy + half))
    c0, c1 = max(0, math.floor(obj.cx - half)), min(size, math.ceil(obj.cx + half))
    sub = (np.arange(supersample) + 0.5) / supersample
    ys = (np.arange(r0, r1)[:, None] + sub[None, :]).reshape(-1) - obj.cy
    xs = (np.arange(c0, c1)[:, None] + sub[None, :]).reshape(-1) - obj.cx
    inside = _inside(obj.shape, xs[None, :], ys[:, None], half).astype(np.float64)
    cov = inside.reshape(r1 - r0, supersample, c1 - c0, supersample).mean(axis=(1, 3))
    return slice(r0, r1), slice(c0, c1), cov


def draw_scene(objects: Sequence[SceneObject], size: int = 32) -> np.ndarray:
    """Paint objects over the background: uint8 [size, size, 3] (coverage-weighted blend per object)."""
    size = check_image_size(size)
    canvas = np.empty((size, size, 3), dtype=np.float64)
    canvas[:] = BACKGROUND
    for obj in objects:
        rows, cols, cov = coverage(obj, size)
        color = np.asarray(PALETTE[obj.color], dtype=np.float64)
        canvas[rows, cols] = canvas[rows, cols] * (1 - cov[..., None]) + color * cov[..., None]
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def render(metadata: dict[str, Any], size: int = 32, seed: int = 0) -> np.ndarray:
    """Ground-truth image of a metadata row: uint8 [size, size, 3]; same (metadata, size, seed) -> same image."""
    return draw_scene(plan_scene(metadata, size, seed), size)


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
