"""GenEval's judging rules (Ghosh et al. 2023, "GenEval", `evaluation/evaluate_images.py`), without any model.

Input: per-image detections (box, score, class name, optional mask) and the prompt's GenEval metadata row
`{"tag", "include": [{"class", "count", "color"?, "position"?: [relation, include index]}], "exclude": [...]}`.

1. Selection (`select_objects`), per class: keep detections with score > `threshold` (0.3; `counting_threshold`
   0.9 for the `counting` tag), best first, at most `max_objects` (16); then greedy NMS dropping boxes whose IoU with
   a kept one is >= `max_overlap` (1.0 = off, GenEval's default). IoU uses GenEval's inclusive pixel boxes
   (`area = (x1 - x0 + 1) * (y1 - y0 + 1)`).
2. Include entry i (`evaluate`): take the first `count` objects of its class; fewer -> unmet. With "color": the
   colour classifier must call at least `count` of them that colour. With "position" `[rel, j]` (only checked when
   the other checks passed): entry j must have been met, and every (object, target object of j) pair must stand in
   `rel`. A met entry's objects become group i (targets for later entries); an unmet entry's group is None.
3. Exclude entry: met when fewer than `count` objects of its class were selected.
4. `relative_position(a, b)`: offset = centre(a) - centre(b); each axis is shrunk towards 0 by
   `position_threshold` (0.1) x (dim_a + dim_b) on that axis; no relation when both shrunk offsets are < 1e-3; else
   `(dx, dy) = shrunk / |offset|` and "left of" dx < -0.5, "right of" dx > 0.5, "above" dy < -0.5, "below" dy > 0.5
   (image y grows downwards).

Scores: `strict` = 1 iff every include and exclude entry is met (GenEval's `correct`, its benchmark accuracy);
`partial` = fraction of entries (include + exclude) met. Differs from Flow-GRPO's reward-server "score", which
rewards exact counts; this one is GenEval's own rule, per clause.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sanarl.rewards.base import RewardInputError
from sanarl.worlds.geneval_templates import COLORS, RELATIONS, row_problem


@dataclass(frozen=True)
class Detection:
    """One detected object: `box` (x0, y0, x1, y1) in pixels, `score` in [0, 1], `label` (GenEval class name),
    `mask` an optional bool `[H, W]` array (instance segmentation) used to grey out the background for colour."""

    box: tuple[float, float, float, float]
    score: float
    label: str
    mask: np.ndarray | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Thresholds:
    """GenEval's options (its defaults): see the module doc."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    max_overlap: float = 1.0
    position_threshold: float = 0.1


@dataclass(frozen=True)
class Verdict:
    """Result for one image: `strict` (0/1), `partial` in [0, 1], per-entry `clauses`, and why entries failed."""

    strict: float
    partial: float
    clauses: dict[str, bool]
    reasons: tuple[str, ...]


ColorFn = Callable[[str, Sequence[Detection]], Sequence[str]]
"""`(class name, objects) -> one colour name per object` (the colour classifier)."""


def check_metadata(prompt: str, metadata: Mapping[str, Any], reward: str = "geneval") -> None:
    """Raise RewardInputError naming the prompt unless `metadata` is a GenEval row (the format of
    sanarl/data/datasets/prompts/geneval/test_metadata.jsonl, without "prompt")."""
    if not metadata or "include" not in metadata:
        raise RewardInputError(
            f"reward {reward!r} needs GenEval metadata for prompt {prompt!r}, got "
            f"{sorted(metadata) if metadata else 'none'}. Score prompts from the geneval prompt set "
            '(`train.train_policy.dataset.name = "geneval"` forwards each row\'s {"tag", "include", "exclude"}), '
            "or pass one such dict per image, or choose another reward."
        )
    problem = row_problem({"prompt": prompt or "?", **metadata})
    if problem is None:
        bad = [e.get("color") for e in metadata["include"] if e.get("color") not in (None, *COLORS)]
        bad += [
            e["position"][0]
            for e in metadata["include"]
            if e.get("position", [RELATIONS[0]])[0] not in RELATIONS
        ]
        problem = f"unknown colour or relation {bad}" if bad else None
    if problem is not None:
        raise RewardInputError(
            f"reward {reward!r}, prompt {prompt!r}: the GenEval metadata is malformed: {problem}. Rows look like "
            '{"tag": "position", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, '
            f'"position": ["left of", 0]}}]}}; colours are {list(COLORS)}, relations {list(RELATIONS)}.'
        )


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two (x0, y0, x1, y1) boxes with GenEval's inclusive-pixel areas `(x1 - x0 + 1) * (y1 - y0 + 1)`."""

    def area(x0: float, y0: float, x1: float, y1: float) -> float:
        return max(x1 - x0 + 1.0, 0.0) * max(y1 - y0 + 1.0, 0.0)

    inter = area(max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(*a[:4]) + area(*b[:4]) - inter
    return inter / union if union else 0.0


def select_objects(detections: Sequence[Detection], tag: str, th: Thresholds) -> dict[str, list[Detection]]:
    """Class name -> kept detections, best first (rule 1 of the module doc)."""
    cutoff = th.counting_threshold if tag == "counting" else th.threshold
    by_class: dict[str, list[Detection]] = {}
    for det in sorted(detections, key=lambda d: -d.score):  # stable: ties keep detector order
        if det.score > cutoff:
            by_class.setdefault(det.label, []).append(det)
    selected: dict[str, list[Detection]] = {}
    for label, dets in by_class.items():
        queue, kept = dets[: th.max_objects], []
        while queue:
            best = queue.pop(0)
            kept.append(best)
            if th.max_overlap < 1.0:
                queue = [d for d in queue if box_iou(best.box, d.box) < th.max_overlap]
        selected[label] = kept
    return selected


def relative_position(a: Sequence[float], b: Sequence[float], position_threshold: float = 0.1) -> set[str]:
    """Relations of box `a` to box `b` (x0, y0, x1, y1), GenEval's rule 4 of the module doc."""
    boxes = np.asarray([a[:4], b[:4]], dtype=np.float64).reshape(2, 2, 2)  # [box, corner, xy]
    centre_a, centre_b = boxes.mean(axis=1)
    dim_a, dim_b = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = centre_a - centre_b
    shrunk = np.sign(offset) * np.maximum(np.abs(offset) - position_threshold * (dim_a + dim_b), 0.0)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    rules = (("left of", dx < -0.5), ("right of", dx > 0.5), ("above", dy < -0.5), ("below", dy > 0.5))
    return {name for name, holds in rules if holds}


def _include_entry(
    entry: Mapping[str, Any],
    objects: Mapping[str, list[Detection]],
    groups: list[list[Detection] | None],
    color_of: ColorFn,
    position_threshold: float,
) -> tuple[list[Detection] | None, str]:
    """(group if the include entry is met else None, reason it failed or "") - rule 2 of the module doc."""
    name, count = entry["class"], int(entry["count"])
    found = objects.get(name, [])[:count]
    if len(found) < count:
        return None, f"expected {name}>={count}, found {len(found)}"
    if "color" in entry:
        colors = list(color_of(name, found))
        if colors.count(entry["color"]) < count:
            return None, f"expected {entry['color']} {name}>={count}, found colours {colors}"
    if "position" in entry:
        relation, target = entry["position"]
        targets = groups[int(target)] if int(target) < len(groups) else None
        if targets is None:
            return None, f"no target for {name} to be {relation}"
        for obj in found:
            for other in targets:
                rels = relative_position(obj.box, other.box, position_threshold)
                if relation not in rels:
                    return None, f"expected {name} {relation} target, found {sorted(rels) or 'no relation'}"
    return found, ""


def evaluate(
    objects: Mapping[str, list[Detection]],
    metadata: Mapping[str, Any],
    color_of: ColorFn,
    position_threshold: float = 0.1,
) -> Verdict:
    """Judge selected objects (from `select_objects`) against a GenEval row; see the module doc for the rules."""
    clauses: dict[str, bool] = {}
    reasons: list[str] = []
    groups: list[list[Detection] | None] = []
    for i, entry in enumerate(metadata["include"]):
        group, reason = _include_entry(entry, objects, groups, color_of, position_threshold)
        groups.append(group)
        clauses[f"include:{i}:{entry['class']}"] = group is not None
        if reason:
            reasons.append(reason)
    for j, entry in enumerate(metadata.get("exclude", []) or []):
        found = len(objects.get(entry["class"], []))
        clauses[f"exclude:{j}:{entry['class']}"] = found < int(entry["count"])
        if found >= int(entry["count"]):
            reasons.append(f"expected {entry['class']}<{entry['count']}, found {found}")
    met = sum(clauses.values())
    return Verdict(float(met == len(clauses)), met / len(clauses), clauses, tuple(reasons))


def judge(
    detections: Sequence[Detection], metadata: Mapping[str, Any], color_of: ColorFn, th: Thresholds
) -> Verdict:
    """Selection then evaluation for one image (raw detections in, verdict out)."""
    objects = select_objects(detections, str(metadata.get("tag", "")), th)
    return evaluate(objects, metadata, color_of, th.position_threshold)
