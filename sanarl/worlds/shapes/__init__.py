"""The shapes world: GenEval-like captioned-shapes prompts, their deterministic renderer and a programmatic judge.

Everything here is numpy + PIL (no torch), so the reward, the bench and the dataset plugin share one definition.
The parts: `spec` (constants, metadata validation), `prompts` (captions, splits), `scene` (layout, rendering),
`judging` (the judge, image statistics) and `captions` (the caption parser); this package re-exports the public
names of the first four, e.g. `from sanarl.worlds import shapes as world; world.render(row)`.
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

from sanarl.worlds.shapes.judging import (
    Detection,
    JudgeResult,
    batch_to_hwc,
    classify_shape,
    detect_objects,
    evaluate_clauses,
    exact_partial_score,
    exact_score,
    image_stats,
    judge,
    judge_batch,
    label_components,
    min_blob_area,
    prompt_object_count,
    relations_between,
    shape_features,
    to_float_image,
)
from sanarl.worlds.shapes.prompts import (
    all_splits,
    canonical_split,
    caption_vocabulary,
    list_prompts,
    sample_item,
    split_of,
)
from sanarl.worlds.shapes.scene import (
    SceneObject,
    check_image_size,
    coverage,
    draw_scene,
    plan_scene,
    render,
)
from sanarl.worlds.shapes.spec import (
    BACKGROUND,
    COUNTS,
    COVERAGE_FLOOR,
    COVERAGE_LEVEL,
    DROP_TRIANGLE,
    FG_THRESHOLD,
    FILL_CIRCLE,
    FILL_SQUARE,
    GAP_FRAC,
    HELDOUT_COLOR_SHAPES,
    HELDOUT_COUNTS,
    HELDOUT_LAYOUTS,
    MARGIN_FRAC,
    MAX_ASPECT,
    MAX_OBJECTS,
    MAX_SIDE_FRAC,
    MIN_BLOB_FRAC,
    MIN_FILL,
    NUMBER_WORDS,
    ORTHO_FRAC,
    PALETTE,
    POSITION_THRESHOLD,
    RELATIONS,
    SHAPES,
    SIZE_RANGES,
    SPLIT_ALIASES,
    SPLITS,
    TAGS,
    validate_metadata,
)

__all__ = [
    "BACKGROUND",
    "PALETTE",
    "SHAPES",
    "RELATIONS",
    "TAGS",
    "NUMBER_WORDS",
    "COUNTS",
    "MAX_OBJECTS",
    "SIZE_RANGES",
    "GAP_FRAC",
    "MARGIN_FRAC",
    "ORTHO_FRAC",
    "HELDOUT_COLOR_SHAPES",
    "HELDOUT_LAYOUTS",
    "HELDOUT_COUNTS",
    "SPLITS",
    "SPLIT_ALIASES",
    "FG_THRESHOLD",
    "COVERAGE_FLOOR",
    "COVERAGE_LEVEL",
    "MIN_BLOB_FRAC",
    "DROP_TRIANGLE",
    "FILL_SQUARE",
    "FILL_CIRCLE",
    "MIN_FILL",
    "MAX_ASPECT",
    "MAX_SIDE_FRAC",
    "POSITION_THRESHOLD",
    "validate_metadata",
    "split_of",
    "canonical_split",
    "list_prompts",
    "all_splits",
    "caption_vocabulary",
    "sample_item",
    "SceneObject",
    "check_image_size",
    "plan_scene",
    "coverage",
    "draw_scene",
    "render",
    "to_float_image",
    "label_components",
    "Detection",
    "shape_features",
    "classify_shape",
    "min_blob_area",
    "detect_objects",
    "relations_between",
    "JudgeResult",
    "prompt_object_count",
    "exact_score",
    "exact_partial_score",
    "evaluate_clauses",
    "judge",
    "batch_to_hwc",
    "judge_batch",
    "image_stats",
]
