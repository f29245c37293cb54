"""Captions of the shapes worlds read back into their metadata rows, so the `shapes` and `motion` judges score
prompts that carry no metadata (a user's prompt file, `sanarl eval --prompts`, a custom plugin).

The grammar (lower case; spaces and a final full stop are ignored):

    caption  := object | object " and " object | single " " relation " " single
    motion   := single " moving " direction
    object   := single | number [colour " "] shape "s"
    single   := ("a" | "one") [colour " "] shape
    number   := "two" | "three" | "four"
    colour   := red | green | blue | yellow          (shapes_world.PALETTE)
    shape    := circle | square | triangle           (shapes_world.SHAPES)
    relation := "to the left of" | "to the right of" | "above" | "below"
    direction:= left | right | up | down             (shapes_video.DIRECTIONS)

e.g. "two red squares", "a blue circle to the left of a yellow square", "a green triangle moving up". The rows
follow the world's own (GenEval's) conventions: a counted object of n also excludes n + 1 of its class; in
"A relation B", B is include[0] and A is include[1] with `"position": [relation, 0]`. Every caption the worlds
generate parses back to exactly its row (tests/unit/test_shapes_captions.py).
"""

from __future__ import annotations

import re
from typing import Any

from sanarl.errors import DataError
from sanarl.worlds import shapes as world

DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
"""Motion words (the keys of shapes_video.DIRECTIONS, repeated here so this module imports no torch)."""

COUNT_WORDS: dict[str, int] = {"a": 1, "one": 1, **{w: n for n, w in world.NUMBER_WORDS.items() if n > 1}}
_PHRASES = {phrase: name for name, phrase in world.RELATIONS.items()}

_COLOUR = "|".join(world.PALETTE)
_SHAPE = "|".join(world.SHAPES)
_OBJECT = (
    rf"(?P<{{p}}n>{'|'.join(COUNT_WORDS)}) (?:(?P<{{p}}c>{_COLOUR}) )?(?P<{{p}}s>{_SHAPE})(?P<{{p}}pl>s?)"
)
_A, _B = _OBJECT.format(p="a"), _OBJECT.format(p="b")
_RELATION = "|".join(re.escape(p) for p in _PHRASES)
_CAPTION = re.compile(rf"{_A}(?:(?P<join> and | (?:{_RELATION}) ){_B})?")
_MOTION = re.compile(rf"{_A} moving (?P<dir>{'|'.join(DIRECTIONS)})")

GRAMMAR = (
    "'[a|one|two|three|four] [colour] shape[s]', two of them joined by 'and' or by a relation (to the left of, to "
    "the right of, above, below), e.g. 'two red squares', 'a blue circle to the left of a yellow square'; "
    f"colours {', '.join(world.PALETTE)}; shapes {', '.join(world.SHAPES)}"
)
MOTION_GRAMMAR = (
    f"'a [colour] shape moving left|right|up|down', e.g. 'a red circle moving left'; colours "
    f"{', '.join(world.PALETTE)}; shapes {', '.join(world.SHAPES)}"
)


def _normalise(caption: str) -> str:
    return " ".join(str(caption).lower().split()).removesuffix(".").strip()


def _entry(match: re.Match, p: str) -> dict[str, Any] | None:
    """The include entry of object `p` ("a" or "b"), or None when its number and plural disagree."""
    count = COUNT_WORDS[match.group(f"{p}n")]
    if (count > 1) != bool(match.group(f"{p}pl")):
        return None
    entry: dict[str, Any] = {"class": match.group(f"{p}s"), "count": count}
    if match.group(f"{p}c"):
        entry["color"] = match.group(f"{p}c")
    return entry


def _tag(include: list[dict[str, Any]], join: str | None) -> str:
    if join and join.strip() != "and":
        return "position"
    coloured = any("color" in e for e in include)
    if len(include) == 2:
        return "color_attr" if coloured else "two_object"
    if include[0]["count"] > 1:
        return "counting"
    return "colors" if coloured else "single_object"


def _row(match: re.Match, prompt: str) -> dict[str, Any] | None:
    first = _entry(match, "a")
    second = _entry(match, "b") if match.group("join") else None
    if first is None or (match.group("join") and second is None):
        return None
    join = match.group("join")
    if join and join.strip() != "and":  # "A relation B": B is the reference, include[0]
        if first["count"] > 1 or second["count"] > 1:
            return None
        include = [second, {**first, "position": [_PHRASES[join.strip()], 0]}]
    else:
        include = [first] + ([second] if second else [])
    row: dict[str, Any] = {"tag": _tag(include, join), "include": include}
    exclude = [{"class": e["class"], "count": e["count"] + 1} for e in include if e["count"] > 1]
    if exclude:
        row["exclude"] = exclude
    row["prompt"] = prompt
    return row


def parse_caption(caption: str) -> dict[str, Any] | None:
    """The shapes-world metadata row a caption states, or None when it is outside the grammar."""
    match = _CAPTION.fullmatch(_normalise(caption))
    return _row(match, str(caption).strip()) if match else None


def parse_motion_caption(caption: str) -> dict[str, Any] | None:
    """The moving-shapes row (`tag` "motion", one object, `motion` direction) of a caption, or None."""
    match = _MOTION.fullmatch(_normalise(caption))
    if not match or match.group("an") not in ("a", "one") or match.group("apl"):
        return None
    entry = _entry(match, "a")
    return {"tag": "motion", "include": [entry], "motion": match.group("dir"), "prompt": str(caption).strip()}


def shapes_row(prompt: str, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The row the `shapes` judge uses: the prompt's metadata when it has `include`, else the parsed caption.

    Raises:
        DataError: naming the prompt and the grammar when there is no metadata and the caption does not parse.
    """
    if metadata and "include" in metadata:
        return metadata
    row = parse_caption(prompt)
    if row is None:
        raise DataError(
            f"prompt {prompt!r} has no shapes-world metadata and its caption is not in the shapes grammar: "
            f"{GRAMMAR}. Rephrase it, give rows with GenEval-format metadata (sanarl.datasets.shapes), or choose "
            "another reward."
        )
    return row


def motion_row(prompt: str, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The row the `motion` judge uses: the metadata when it has `motion`, else the parsed caption.

    Raises:
        DataError: naming the prompt and the grammar when neither gives a direction.
    """
    if metadata and "motion" in metadata:
        return metadata
    row = parse_motion_caption(prompt)
    if row is None:
        raise DataError(
            f"prompt {prompt!r} has no moving-shapes metadata and its caption is not in the motion grammar: "
            f"{MOTION_GRAMMAR}. Rephrase it, use sanarl.datasets.shapes with policy.diffusers.is_video = true, "
            "or choose another reward."
        )
    return row
