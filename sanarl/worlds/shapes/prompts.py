"""Captions, prompt sets and the train / held-out split of the shapes world (docs/shapes.md)."""

from __future__ import annotations

import copy
import functools
import itertools
from typing import Any

import numpy as np

from sanarl.errors import DataError
from sanarl.worlds.shapes.spec import (
    COUNTS,
    HELDOUT_COLOR_SHAPES,
    HELDOUT_COUNTS,
    HELDOUT_LAYOUTS,
    NUMBER_WORDS,
    PALETTE,
    RELATIONS,
    SHAPES,
    SPLIT_ALIASES,
    SPLITS,
    TAGS,
)

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


def canonical_split(split: str, key: str = "split", example: str | None = None) -> str:
    """Map a split name (train | test | heldout) to "train" or "test".

    Raises:
        DataError: naming `key` when the name is unknown, with `example` as the fix (default: `--set key="test"`).
    """
    name = SPLIT_ALIASES.get(str(split).strip().lower())
    if name is None:
        fix = example or f'--set {key}="test"'
        raise DataError(
            f'`{key}` is {split!r}, which the shapes world does not have. Use "train" (seen combinations) or '
            f'"test" (alias "heldout": held-out combinations), e.g. `{fix}`.'
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
