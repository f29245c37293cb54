"""World specification and metadata validation: sizes, palette, shapes, relations, the held-out combinations, judge thresholds (docs/shapes.md)."""

from __future__ import annotations

from typing import Any

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
