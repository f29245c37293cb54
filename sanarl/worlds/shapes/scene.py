"""Scene layout and rendering of the shapes world: deterministic placement and anti-aliased drawing (docs/shapes.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sanarl.errors import DataError
from sanarl.worlds.shapes.spec import (
    BACKGROUND,
    GAP_FRAC,
    MARGIN_FRAC,
    MAX_OBJECTS,
    ORTHO_FRAC,
    PALETTE,
    RELATIONS,
    SIZE_RANGES,
    _bad,
    validate_metadata,
)

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
