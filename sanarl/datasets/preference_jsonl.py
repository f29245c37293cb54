"""Pair plugin for human-preference data in JSONL (Pick-a-Pic v2's and HPD v2's records; docs/plugins.md, "Pair
items"; docs/dpo.md).

Usage: `sanarl --config sd35m-dpo sanarl.datasets.preference_jsonl --set
train.train_policy.dataset.local_dir=/path/to/pairs.jsonl`.

`train.train_policy.dataset.local_dir` is the JSONL file, or a folder holding exactly one `*.jsonl`. One JSON object
per line, in either layout:

- Pick-a-Pic v2 (its columns `caption`, `jpg_0`, `jpg_1`, `label_0`, the images as files):
  `{"caption": "...", "jpg_0": "images/a.jpg", "jpg_1": "images/b.jpg", "label_0": 1}`. `label_0` is 1 when
  `jpg_0` is preferred, 0 when `jpg_1` is, 0.5 for a tie; ties are skipped (counted in `skipped_ties`), as
  DiffusionDPO drops Pick-a-Pic's no-decision rows.
- HPD v2 (its `prompt`, `image_path`, `human_preference`): `{"prompt": "...", "image_path": ["a.jpg", "b.jpg"],
  "human_preference": [1, 0]}`, the preferred image marked 1 and the other 0 (two images per line).

Image paths are absolute or relative to the JSONL file's folder. Every line is checked when the dataset is built
(before any model loads): a line that is not a JSON object, lacks a field of its layout, holds a bad label or names
an image file that does not exist is a DataError naming `file:line`, the field and the fix. Images are read on
access with `sanarl.datasets.common.load_image` (resized to cover `policy.diffusers.inference_size`, centre crop);
with `policy.diffusers.is_video` the paths are videos, read as `policy.diffusers.train_frames`-frame clips
[3, T, H, W] (`sanarl.datasets.diffusers_dataset.load_clip`: a window drawn from (train.seed, line), PyAV).
Items are pair items (sanarl.datasets.pairs): `{"prompt", "chosen", "rejected"}`. `get_val_dataset`: the prompts of
`validation.dataset.local_dir` in the same layout, when set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.datasets import common
from sanarl.datasets.diffusers_dataset import load_clip
from sanarl.errors import DataError

TRAIN_KEY = "train.train_policy.dataset.local_dir"
VAL_KEY = "validation.dataset.local_dir"
PICKAPIC_FIELDS: tuple[str, ...] = ("caption", "jpg_0", "jpg_1", "label_0")
HPD_FIELDS: tuple[str, ...] = ("prompt", "image_path", "human_preference")
LAYOUTS = (
    'Pick-a-Pic {"caption": str, "jpg_0": path, "jpg_1": path, "label_0": 1 | 0 | 0.5} or HPD {"prompt": str, '
    '"image_path": [path, path], "human_preference": [1, 0] | [0, 1]}'
)

collate = common.collate


@dataclass(frozen=True)
class Pair:
    """One usable line: its prompt, the preferred and the other image file, and where it came from."""

    prompt: str
    chosen: Path
    rejected: Path
    where: str
    """`file:line`, for messages."""


def find_jsonl(local_dir: str, key: str) -> Path:
    """The JSONL file `local_dir` names: the file itself, or the only `*.jsonl` of that folder.

    Raises:
        DataError: naming `key` when it is empty, does not exist, or names a folder without exactly one JSONL.
    """
    if not local_dir.strip():
        raise DataError(
            f"`{key}` is empty, so sanarl.datasets.preference_jsonl has no pairs. Set it to a JSONL file of "
            f"preference pairs ({LAYOUTS}), e.g. `--set {key}=data/pairs.jsonl`; see docs/dpo.md."
        )
    path = Path(local_dir).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if path.is_file():
        return path
    if not path.is_dir():
        raise DataError(f"`{key}` = {local_dir!r}: {str(path)!r} does not exist. Fix the path.")
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".jsonl" and p.is_file())
    if len(found) != 1:
        what = (
            "no *.jsonl file"
            if not found
            else f"{len(found)} JSONL files ({', '.join(p.name for p in found[:5])})"
        )
        raise DataError(
            f"`{key}` = {local_dir!r} is a folder with {what}; point `{key}` at the JSONL file to use."
        )
    return found[0]


def _field(row: dict[str, Any], name: str, where: str, layout: str) -> Any:
    if name not in row:
        raise DataError(
            f"{where}: the {layout} line lacks the field `{name}` (it has {sorted(row)}); every line needs "
            f"{LAYOUTS}. Add the field or drop the line."
        )
    return row[name]


def _image(value: Any, base: Path, where: str, name: str) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise DataError(
            f"{where}: `{name}` = {value!r} is not an image path; give the file's path as a string."
        )
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise DataError(
            f"{where}: `{name}` names {str(path)!r}, which does not exist (relative paths are read from the JSONL "
            "file's folder). Fix the path, add the file, or drop the line."
        )
    return path


def _prompt(value: Any, where: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataError(
            f"{where}: `{name}` = {value!r} is not a non-empty prompt string; fix or drop the line."
        )
    return value.strip()


def parse_pickapic(row: dict[str, Any], base: Path, where: str) -> Pair | None:
    """A Pick-a-Pic line as a pair (None for a tie, label_0 = 0.5)."""
    prompt = _prompt(_field(row, "caption", where, "Pick-a-Pic"), where, "caption")
    label = _field(row, "label_0", where, "Pick-a-Pic")
    images = [_image(_field(row, k, where, "Pick-a-Pic"), base, where, k) for k in ("jpg_0", "jpg_1")]
    if isinstance(label, bool) or label not in (0, 1, 0.5):
        raise DataError(
            f"{where}: `label_0` = {label!r}; it is 1 (jpg_0 preferred), 0 (jpg_1 preferred) or 0.5 (a tie, skipped)."
        )
    if label == 0.5:
        return None
    first = label == 1
    return Pair(prompt, images[0 if first else 1], images[1 if first else 0], where)


def parse_hpd(row: dict[str, Any], base: Path, where: str) -> Pair:
    """An HPD line (two images) as a pair."""
    prompt = _prompt(_field(row, "prompt", where, "HPD"), where, "prompt")
    paths, pref = _field(row, "image_path", where, "HPD"), _field(row, "human_preference", where, "HPD")
    if not isinstance(paths, list) or len(paths) != 2:
        raise DataError(f"{where}: `image_path` = {paths!r} must list the pair's two image paths.")
    if pref not in ([1, 0], [0, 1]):
        raise DataError(
            f"{where}: `human_preference` = {pref!r} must be [1, 0] (the first image preferred) or [0, 1]."
        )
    images = [_image(p, base, where, f"image_path[{i}]") for i, p in enumerate(paths)]
    first = pref == [1, 0]
    return Pair(prompt, images[0 if first else 1], images[1 if first else 0], where)


def parse_line(text: str, base: Path, where: str) -> Pair | None:
    """One JSONL line as a pair (None: a tie); its layout is told by its fields (`caption` -> Pick-a-Pic)."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{where}: not valid JSON ({exc.msg}); each line is one JSON object, {LAYOUTS}."
        ) from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: a JSON {type(row).__name__}, not an object; each line is {LAYOUTS}.")
    return (
        parse_pickapic(row, base, where)
        if "caption" in row or "jpg_0" in row
        else parse_hpd(row, base, where)
    )


def read_pairs(jsonl: Path) -> tuple[list[Pair], int]:
    """Every pair of the file and the count of skipped ties (DataError on the first bad line; on no pair)."""
    pairs, ties = [], 0
    with jsonl.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            pair = parse_line(text, jsonl.parent, f"{jsonl}:{number}")
            if pair is None:
                ties += 1
            else:
                pairs.append(pair)
    if not pairs:
        raise DataError(f"{jsonl} holds no preference pair ({ties} ties skipped); each line is {LAYOUTS}.")
    return pairs, ties


class PreferencePairs(Dataset):
    """The pairs of one JSONL file, images read on access at `size` = [H, W] (clips of `frames` frames when set)."""

    def __init__(self, jsonl: Path, size: tuple[int, int], frames: int | None = None, seed: int = 0) -> None:
        self.pairs, self.skipped_ties = read_pairs(jsonl)
        self.size, self.frames, self.seed = size, frames, seed

    def __len__(self) -> int:
        return len(self.pairs)

    def _read(self, path: Path, index: int) -> torch.Tensor:
        if self.frames is None:
            return common.load_image(path, self.size)
        return load_clip(path, self.size, self.frames, self.seed, index)

    def __getitem__(self, index: int) -> dict[str, Any]:
        pair = self.pairs[index]
        return {"prompt": pair.prompt, "chosen": self._read(pair.chosen, index),
                "rejected": self._read(pair.rejected, index)}  # fmt: skip


class PairPrompts(Dataset):
    """The prompts of a pair file (validation items `{"prompt", "metadata"}`)."""

    def __init__(self, jsonl: Path) -> None:
        self.prompts = [p.prompt for p in read_pairs(jsonl)[0]]

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"prompt": self.prompts[index], "metadata": {}}


def get_dataset(config: Config) -> PreferencePairs:
    """The training pairs of `train.train_policy.dataset.local_dir` (DataError as `read_pairs`)."""
    diff = config.policy.diffusers
    size = common.check_size(diff.inference_size)
    frames = diff.train_frames if diff.is_video else None
    jsonl = find_jsonl(config.train.train_policy.dataset.local_dir, TRAIN_KEY)
    return PreferencePairs(jsonl, size, frames, config.train.seed)


def get_val_dataset(config: Config) -> PairPrompts | None:
    """The prompts of `validation.dataset.local_dir` (None when unset)."""
    local = config.validation.dataset.local_dir
    return PairPrompts(find_jsonl(local, VAL_KEY)) if local.strip() else None
