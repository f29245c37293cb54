"""GenEval-style prompt generator: a train split in the format of `sanarl/data/datasets/prompts/geneval/test_metadata.jsonl`.

GenEval (Ghosh et al., 2023, "GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment") builds its
benchmark prompts from six templates over the 80 COCO classes and 10 colours. Its train prompts are not shipped
here, so this module regenerates prompts from the same templates:

| tag | template | include (exclude) |
|---|---|---|
| single_object | "a photo of a X" | [{X, 1}] |
| two_object | "a photo of a X and a Y" | [{X, 1}, {Y, 1}] |
| counting | "a photo of three Xs" (two, three, four) | [{X, n}] ([{X, n + 1}]) |
| colors | "a photo of a red X" | [{X, 1, red}] |
| position | "a photo of a X right of a Y" (left of, right of, above, below) | [{Y, 1}, {X, 1, position [rel, 0]}] |
| color_attr | "a photo of a red X and a blue Y" | [{X, 1, red}, {Y, 1, blue}] |

X != Y and the two colours of color_attr differ. Words follow the benchmark's own spelling so that train and test
prompts share one vocabulary: "an" before a vowel letter ("an orange X", "an umbrella"), and plurals by GenEval's
naive rule, "+es" after a final "s" ("buses", "wine glasses") and "+s" otherwise ("benchs", "knifes", "sheeps" as in
the benchmark), with "skis" and "scissors" left as they are. `render(row)` reproduces every one of the 2,212
shipped test prompts from its metadata (tested).

Sampling: each tag is a finite pool of prompts indexed by a mixed-radix number (e.g. counting: class x count,
80 x 3 = 240). A generated row draws its tag from a balanced, shuffled list, then an index uniformly from the pool,
and redraws while the prompt is in `excluded` (the test prompts). Rows are drawn with replacement (GenEval's
own test repeats each prompt 4 times). A tag whose every prompt is excluded is dropped with a warning: with the
shipped test file this is `single_object`, whose 80 prompts all appear in the test split. Everything depends only on
the seed (`random.Random(seed)`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Collection, Sequence
from typing import Any

log = logging.getLogger(__name__)

COCO_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
"""The 80 COCO object classes, in COCO order, with GenEval's names ("tv", "computer mouse", "hair drier", ...)."""

COLORS: tuple[str, ...] = (
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
)
"""GenEval's 10 colours."""

RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
"""GenEval's relative positions ("a photo of a X <relation> a Y")."""

COUNT_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
"""Counts used by the counting tag and their words."""

TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""GenEval's six categories, in the order the generator cycles through them."""

INVARIANT_PLURALS: frozenset[str] = frozenset({"skis", "scissors"})
"""Class names that are already plural."""

_N, _C = len(COCO_CLASSES), len(COLORS)
RADICES: dict[str, tuple[int, ...]] = {
    "single_object": (_N,),
    "two_object": (_N, _N - 1),
    "counting": (_N, len(COUNT_WORDS)),
    "colors": (_N, _C),
    "position": (_N, _N - 1, len(RELATIONS)),
    "color_attr": (_N, _N - 1, _C, _C - 1),
}
"""Mixed-radix digits of each tag's pool; a `_N - 1` (or `_C - 1`) digit picks a second, different item."""


def pool_size(tag: str) -> int:
    """Number of distinct prompts of `tag`: 80, 6,320, 240, 800, 25,280 and 568,800 in TAGS order."""
    size = 1
    for radix in RADICES[tag]:
        size *= radix
    return size


def with_article(phrase: str) -> str:
    """'a X', or 'an X' when the phrase starts with a vowel letter (GenEval's rule): 'an orange cup'."""
    return ("an " if phrase[:1] in "aeiou" else "a ") + phrase


def plural(name: str) -> str:
    """GenEval's plural: 'bus' -> 'buses', 'bench' -> 'benchs', 'skis' -> 'skis' (see the module docstring)."""
    if name in INVARIANT_PLURALS:
        return name
    return name + ("es" if name.endswith("s") else "s")


def _phrase(entry: dict[str, Any]) -> str:
    """'a red cup' / 'an apple' for one include entry (count 1)."""
    color = entry.get("color")
    return with_article(f"{color} {entry['class']}" if color else entry["class"])


def render(row: dict[str, Any]) -> str:
    """The GenEval prompt that `row`'s tag and include list describe (the inverse of the metadata).

    Example: {"tag": "counting", "include": [{"class": "bus", "count": 3}]} -> "a photo of three buses".

    Raises:
        ValueError: when the tag is not one of TAGS.
    """
    tag, inc = row["tag"], row["include"]
    if tag in ("single_object", "colors"):
        return f"a photo of {_phrase(inc[0])}"
    if tag in ("two_object", "color_attr"):
        return f"a photo of {_phrase(inc[0])} and {_phrase(inc[1])}"
    if tag == "counting":
        return f"a photo of {COUNT_WORDS[inc[0]['count']]} {plural(inc[0]['class'])}"
    if tag == "position":
        return f"a photo of {_phrase(inc[1])} {inc[1]['position'][0]} {_phrase(inc[0])}"
    raise ValueError(f"unknown GenEval tag {tag!r}; expected one of {list(TAGS)}")


def _digits(index: int, radices: Sequence[int]) -> list[int]:
    """Mixed-radix digits of `index`, most significant first: _digits(7, (3, 4)) = [1, 3]."""
    out = []
    for radix in reversed(radices):
        index, digit = divmod(index, radix)
        out.append(digit)
    return out[::-1]


def _other(first: int, digit: int) -> int:
    """The `digit`-th item of range(n) without `first` (digit in [0, n - 1)): _other(2, 2) = 3."""
    return digit if digit < first else digit + 1


def row_at(tag: str, index: int) -> dict[str, Any]:
    """The `index`-th row (0 <= index < pool_size(tag)) of a tag's pool, in GenEval's JSONL format.

    Keys in the test file's order: tag, include, exclude (counting only), prompt.
    """
    d = _digits(index, RADICES[tag])
    x = COCO_CLASSES[d[0]]
    y = COCO_CLASSES[_other(d[0], d[1])] if tag in ("two_object", "position", "color_attr") else ""
    row: dict[str, Any] = {"tag": tag}
    if tag == "single_object":
        row["include"] = [{"class": x, "count": 1}]
    elif tag == "two_object":
        row["include"] = [{"class": x, "count": 1}, {"class": y, "count": 1}]
    elif tag == "counting":
        n = sorted(COUNT_WORDS)[d[1]]
        row["include"] = [{"class": x, "count": n}]
        row["exclude"] = [{"class": x, "count": n + 1}]
    elif tag == "colors":
        row["include"] = [{"class": x, "count": 1, "color": COLORS[d[1]]}]
    elif tag == "position":
        row["include"] = [
            {"class": y, "count": 1},
            {"class": x, "count": 1, "position": [RELATIONS[d[2]], 0]},
        ]
    else:  # color_attr
        c0, c1 = COLORS[d[2]], COLORS[_other(d[2], d[3])]
        row["include"] = [{"class": x, "count": 1, "color": c0}, {"class": y, "count": 1, "color": c1}]
    row["prompt"] = render(row)
    return row


def has_free_prompt(tag: str, excluded: Collection[str]) -> bool:
    """Whether some prompt of `tag` is not in `excluded` (pigeonhole first, else enumerate the pool)."""
    size = pool_size(tag)
    if size > len(excluded):
        return True
    return any(row_at(tag, i)["prompt"] not in excluded for i in range(size))


def generate(
    size: int, seed: int, excluded: Collection[str] = frozenset(), tags: Sequence[str] = TAGS
) -> list[dict[str, Any]]:
    """`size` GenEval-style rows, none of whose prompts is in `excluded`; a pure function of its arguments.

    Args:
        size: number of rows (>= 1).
        seed: seed of the `random.Random` stream.
        excluded: prompts never to emit (the test split's prompts).
        tags: tags to draw from, balanced (each gets floor or ceil of size / len(tags) rows), then shuffled.

    Returns:
        rows `{"tag", "include", ["exclude",] "prompt"}` as in `geneval/test_metadata.jsonl`.

    Raises:
        ValueError: size < 1, an unknown tag, or no tag with a free prompt.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown GenEval tags {unknown}; expected some of {list(TAGS)}")
    excluded = frozenset(excluded)
    active = [t for t in tags if has_free_prompt(t, excluded)]
    dropped = [t for t in tags if t not in active]
    if dropped:
        log.warning(
            "geneval generator: every prompt of tag(s) %s is excluded (in the test split); skipped", dropped
        )
    if not active:
        raise ValueError(f"every prompt of the tags {list(tags)} is excluded; nothing to generate")
    rng = random.Random(seed)
    order = [active[i % len(active)] for i in range(size)]
    rng.shuffle(order)
    rows = []
    for tag in order:
        row = row_at(tag, rng.randrange(pool_size(tag)))
        while row["prompt"] in excluded:
            row = row_at(tag, rng.randrange(pool_size(tag)))
        rows.append(row)
    return rows


def _entry_problem(entry: Any, where: str, n_include: int, index: int) -> str | None:
    """What is wrong with one include / exclude entry (None = fine)."""
    if not isinstance(entry, dict):
        return f"{where} is not an object"
    if not isinstance(entry.get("class"), str) or not entry["class"]:
        return f'{where} has no "class" string'
    count = entry.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return f"{where}.count is {count!r}, not an integer >= 1"
    if "color" in entry and not isinstance(entry["color"], str):
        return f"{where}.color is {entry['color']!r}, not a string"
    if "position" in entry:
        pos = entry["position"]
        ok = isinstance(pos, list) and len(pos) == 2 and pos[0] in RELATIONS and isinstance(pos[1], int)
        if not ok or not 0 <= pos[1] < n_include or pos[1] == index:
            return (
                f"{where}.position is {pos!r}, not [one of {list(RELATIONS)}, index of another include entry]"
            )
    return None


def row_problem(row: Any) -> str | None:
    """What is wrong with a GenEval metadata row (None = fine): the format the GenEval reward reads.

    A row is an object with a string "tag", a non-empty "include" list of `{"class": str, "count": int >= 1,
    "color"?: str, "position"?: [relation, other include index]}`, an optional "exclude" list of the same entries
    and a non-empty string "prompt".
    """
    if not isinstance(row, dict):
        return "the row is not a JSON object"
    if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        return 'it has no non-empty "prompt" string'
    if not isinstance(row.get("tag"), str):
        return 'it has no "tag" string'
    include = row.get("include")
    if not isinstance(include, list) or not include:
        return 'it needs a non-empty "include" list'
    exclude = row.get("exclude", [])
    if not isinstance(exclude, list):
        return '"exclude" is not a list'
    entries = [(e, f"include[{i}]", i) for i, e in enumerate(include)]
    entries += [(e, f"exclude[{i}]", -1) for i, e in enumerate(exclude)]
    for entry, where, index in entries:
        problem = _entry_problem(entry, where, len(include), index)
        if problem:
            return problem
    return None
