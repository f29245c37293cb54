"""RL prompt-set plugin (DiffusionNFT / Flow-GRPO prompt sets): `sanarl.datasets.diffusion_nft`.

Usage: `sanarl --config sana-image-nft sanarl.datasets.diffusion_nft`. Items are RL items
`{"prompt": str, "metadata": dict}`; the metadata goes to the reward functions untouched.

Config keys read (`[train.train_policy.dataset]` for `get_dataset`, `[validation.dataset]` for `get_val_dataset`):
- `name`: a shipped prompt set, or "" with `local_dir` set (a custom file). Shipped (sanarl/data/datasets/prompts/PROVENANCE.md):

  | name | splits | metadata |
  |---|---|---|
  | pickscore | train (25,432), test (2,048) | {} |
  | ocr | test (1,018) | {"target": first "double-quoted" span of the prompt, None when there is none} |
  | geneval | test (2,212); train generated (subset "generated") | GenEval row minus "prompt": tag, include, exclude |
  | drawbench | test (1,000) | {} |
  | dance_grpo_t2v | train, test | {} |

  `dance_grpo_t2v` is Cosmos-RL's name for DanceGRPO's video prompts (`assets/video_prompts.txt` of XueZeyue/DanceGRPO,
  which Cosmos-RL uses for both splits). That file is not shipped: put it at `prompts/dance_grpo_t2v/<split>.txt`
  under `$SANARL_DATA_DIR` to use it; otherwise sanarl's curated video prompts (`prompts/video_<split>.txt`, disjoint
  train and test) stand in, with a note in `PromptSet.notes`.

- `split`: the file `<split>_metadata.jsonl`, else `<split>.txt`, of the set's folder. A split that is not there is
  a `DataError` (never a silent fall-back to another split).
- `subset`: "" (all rows); "filter_nsfw" drops prompts containing a word of `NSFW_WORDS` (meant for pickscore, whose
  Pick-a-Pic captions include explicit ones; a crude keyword filter, not a classifier; the count is logged once);
  "generated" (geneval only, split "train") builds GenEval-style train prompts with `geneval_templates`, excluding
  every prompt of the geneval test file.
- `size`: "generated": number of rows (default 50,000, ~1 s to build); file sets: keep the first `size` rows.
- `local_dir`: a custom prompt file (`.txt`, one prompt a line; `.jsonl`, one object a line with "prompt" and any
  other fields, which become the metadata) or a folder laid out like a shipped set (`<split>.txt` /
  `<split>_metadata.jsonl`). With `name` also set, the set's row handling applies (ocr targets, geneval checks).
- `train.seed`: seed of the generated rows (validation uses train.seed + 1).

Shipped sets are package data in `sanarl/data/datasets/prompts/<name>/` (found from any working directory);
`$SANARL_DATA_DIR` replaces that `datasets/` folder (it must hold `prompts/<name>/`).
Text files are UTF-8; lines are stripped and blank lines skipped.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from sanarl.config.presets import data_dir
from sanarl.config.schema import Config, DatasetConfig
from sanarl.datasets.pairs import PAIR_PLUGINS
from sanarl.errors import ConfigError, DataError
from sanarl.worlds import geneval_templates

log = logging.getLogger(__name__)

KNOWN_SETS: tuple[str, ...] = ("pickscore", "ocr", "geneval", "drawbench", "dance_grpo_t2v")
"""Prompt-set names (shipped under sanarl/data/datasets/prompts/; dance_grpo_t2v has a stand-in, see the module docstring)."""
VIDEO_STAND_IN = "dance_grpo_t2v"

DATA_DIR_ENV = "SANARL_DATA_DIR"
"""Environment variable that replaces the shipped `sanarl/data/datasets/` folder."""

TRAIN_KEY = "train.train_policy.dataset"
VAL_KEY = "validation.dataset"
DEFAULT_GENERATED_SIZE = 50_000
"""Rows of a generated GenEval train split when `dataset.size` is not set."""

NSFW_WORDS: tuple[str, ...] = (
    "nsfw", "nude", "nudes", "nudity", "naked", "topless", "porn", "porno", "pornographic", "pornography",
    "hentai", "erotic", "erotica", "sex", "sexual", "sexy", "nipple", "nipples", "breast", "breasts", "boob",
    "boobs", "tits", "genitals", "penis", "vagina", "pussy", "dildo", "dildos", "orgasm", "bdsm", "fetish",
    "stripper", "lingerie",
)  # fmt: skip
"""Whole words (any letter case) that `subset = "filter_nsfw"` drops a prompt for."""

_NSFW_SET = frozenset(NSFW_WORDS)
_WORD_RE = re.compile(r"\w+")
_QUOTED_RE = re.compile(r'"([^"]*)"')
Row = tuple[str, dict[str, Any]]
"""(prompt, metadata)."""


def is_nsfw(prompt: str) -> bool:
    """Whether a whole word of `prompt` (any letter case) is in NSFW_WORDS: 'a NUDE statue' yes, 'Essex' no."""
    return not _NSFW_SET.isdisjoint(_WORD_RE.findall(prompt.lower()))


@dataclass(frozen=True)
class Request:
    """What one dataset section asks for; `key` is its config prefix, named in errors."""

    name: str
    subset: str
    split: str
    local_dir: str
    size: int | None
    seed: int
    key: str

    @classmethod
    def of(cls, ds: DatasetConfig, key: str, seed: int) -> Request:
        """Normalise a `DatasetConfig` (names and subsets lower-cased, whitespace stripped)."""
        name, subset = ds.name.strip().lower(), ds.subset.strip().lower()
        return cls(name, subset, ds.split.strip(), ds.local_dir.strip(), ds.size, seed, key)


class PromptSet(Dataset):
    """RL prompts with per-row metadata.

    Attributes:
        rows: (prompt, metadata) pairs in file (or generation) order.
        source: the file the rows came from, or a description of the generator.
        stats: counts of what loading did: "nsfw_dropped", "ocr_without_target", ... (only those that apply).
    """

    def __init__(
        self,
        rows: list[Row],
        source: str,
        stats: dict[str, int] | None = None,
        notes: list[str] | None = None,
    ) -> None:
        self.rows = rows
        self.source = source
        self.stats = dict(stats or {})
        self.notes = list(notes or [])
        """What the user should know about where the rows came from (`sanarl validate` prints these)."""

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """`{"prompt": str, "metadata": dict}`; the metadata is a copy, so a reward cannot alter the set."""
        prompt, metadata = self.rows[index]
        return {"prompt": prompt, "metadata": copy.deepcopy(metadata)}


def data_root() -> Path:
    """The folder holding `prompts/<name>/`: `$SANARL_DATA_DIR`, else the shipped `sanarl/data/datasets/`.

    Raises:
        DataError: when `$SANARL_DATA_DIR` is set but is not a directory.
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if not env:
        return data_dir("datasets")
    root = Path(env).expanduser()
    if not root.is_dir():
        raise DataError(
            f"${DATA_DIR_ENV} = {env!r} is not a directory. Point it to a folder holding prompts/<name>/ "
            f"(a copy of the shipped sanarl/data/datasets/ folder), or unset it to use the shipped one."
        )
    return root


def check_name(req: Request) -> None:
    """Reject a name that is not a shipped set (listing the known ones); "" passes (a custom file)."""
    if req.name and req.name not in KNOWN_SETS:
        raise DataError(
            f"`{req.key}.name` = {req.name!r} is not a prompt set of sanarl.datasets.diffusion_nft. Use one of "
            f"{list(KNOWN_SETS)}, or leave it empty and set `{req.key}.local_dir` to your own .txt / .jsonl "
            "prompt file."
        )


def shipped_dir(req: Request) -> Path:
    """`<data root>/prompts/<name>`.

    Raises:
        DataError: when that folder does not exist.
    """
    folder = data_root() / "prompts" / req.name
    if not folder.is_dir():
        raise DataError(
            f"`{req.key}.name` = {req.name!r}: its folder {str(folder)!r} does not exist. The prompt sets ship in "
            f"the sanarl package (sanarl/data/datasets/; reinstall sanarl), or set "
            f"${DATA_DIR_ENV} to a copy of that folder."
        )
    return folder


def split_file(folder: Path, split: str) -> Path | None:
    """`<split>_metadata.jsonl` if present, else `<split>.txt` if present, else None."""
    for candidate in (folder / f"{split}_metadata.jsonl", folder / f"{split}.txt"):
        if candidate.is_file():
            return candidate
    return None


def splits_in(folder: Path) -> list[str]:
    """Split names a folder offers (from `<split>.txt` and `<split>_metadata.jsonl`), sorted."""
    names = {p.stem for p in folder.glob("*.txt")}
    names |= {p.name[: -len("_metadata.jsonl")] for p in folder.glob("*_metadata.jsonl")}
    return sorted(names)


def missing_split(req: Request, folder: Path) -> DataError:
    """The error for a split that `folder` does not hold, with the way out for the set at hand."""
    what = f"the {req.name} prompt set" if req.name else "the prompt folder"
    msg = (
        f"`{req.key}.split` = {req.split!r}: {what} has no {req.split!r} split in {str(folder)!r} (found: "
        f"{', '.join(splits_in(folder)) or 'none'}; expected {req.split}.txt, one prompt a line, or "
        f'{req.split}_metadata.jsonl, one {{"prompt": ...}} object a line).'
    )
    if req.name == "geneval":
        msg += (
            " The GenEval train split is not shipped. Generate one from GenEval's templates with "
            f'`{req.key}.name = "geneval"`, `{req.key}.subset = "generated"`, `{req.key}.size = N`, or use the '
            f'test split explicitly with `{req.key}.split = "test"`.'
        )
    elif req.name == "ocr":
        msg += (
            f' The OCR train split is not shipped. Use the test split explicitly with `{req.key}.split = "test"`, '
            f"or point `{req.key}.local_dir` to a folder holding your own {req.split}.txt (one prompt a line, the "
            'text to render in "double quotes"; the OCR train set of Cosmos-RL and DiffusionNFT is '
            "dataset/ocr/train.txt of NVlabs/DiffusionNFT)."
        )
    else:
        msg += f" Set `{req.key}.split` to one of the splits found, or add the file."
    return DataError(msg + " sanarl never falls back to another split silently.")


def _read_lines(path: Path, key: str) -> list[tuple[int, str]]:
    """(1-based line number, stripped text) of the non-blank lines of a UTF-8 file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"`{key}`: {str(path)!r} is not UTF-8 text ({exc}). Re-save it as UTF-8.") from exc
    except OSError as exc:
        raise DataError(
            f"`{key}`: cannot read {str(path)!r}: {exc}. Check the path and permissions."
        ) from exc
    lines = [(i + 1, line.strip()) for i, line in enumerate(text.splitlines())]
    lines = [(n, line) for n, line in lines if line]
    if not lines:
        raise DataError(
            f"`{key}`: the prompt file {str(path)!r} is empty (no non-blank lines). Put one prompt per line "
            '(.txt) or one {"prompt": ...} object per line (.jsonl).'
        )
    return lines


def read_txt(path: Path, key: str) -> list[Row]:
    """One row per non-blank line, metadata {}."""
    return [(line, {}) for _, line in _read_lines(path, key)]


def read_jsonl(path: Path, key: str, check: Callable[[dict], str | None] | None = None) -> list[Row]:
    """One row per non-blank line: "prompt" is the prompt, every other field the metadata.

    Raises:
        DataError: naming the file and line for malformed JSON, a non-object, a missing / empty / non-string
            "prompt", or a row that `check` reports a problem for.
    """
    rows = []
    for number, line in _read_lines(path, key):
        where = f"`{key}`: {str(path)!r} line {number}"
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DataError(f"{where} is not valid JSON ({exc}). Each line must be one JSON object.") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise DataError(
                f'{where} has no non-empty "prompt" string. Each line must be an object such as '
                '{"prompt": "a photo of a cat", ...}; other fields become the metadata.'
            )
        problem = check(obj) if check else None
        if problem:
            raise DataError(
                f'{where} is not a valid GenEval row: {problem}. Rows look like {{"tag": "counting", '
                '"include": [{"class": "bus", "count": 3}], "prompt": "a photo of three buses"} (see '
                "sanarl/data/datasets/prompts/geneval/test_metadata.jsonl)."
            )
        rows.append((obj["prompt"].strip(), {k: v for k, v in obj.items() if k != "prompt"}))
    return rows


def _file_key(req: Request) -> str:
    """The config key that chose the file being read: `local_dir` when set, else `name`."""
    return f"{req.key}.local_dir" if req.local_dir else f"{req.key}.name"


def read_prompt_file(path: Path, req: Request) -> list[Row]:
    """Rows of a .txt or .jsonl prompt file (geneval rows are checked with `geneval_templates.row_problem`)."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        check = geneval_templates.row_problem if req.name == "geneval" else None
        return read_jsonl(path, _file_key(req), check)
    if suffix == ".txt" and req.name != "geneval":
        return read_txt(path, _file_key(req))
    if suffix == ".txt":
        raise DataError(
            f"`{req.key}.local_dir` = {req.local_dir!r}: geneval prompts need their metadata (tag, include, "
            "exclude), so give a .jsonl file in the format of sanarl/data/datasets/prompts/geneval/test_metadata.jsonl, or "
            f"clear `{req.key}.name` to use the .txt as plain prompts."
        )
    raise DataError(
        f"`{req.key}.local_dir` = {req.local_dir!r}: {path.name!r} is neither .txt (one prompt a line) nor .jsonl "
        '(one {"prompt": ...} object a line). Convert it, or point to a folder holding <split>.txt.'
    )


def _local_path(req: Request) -> Path:
    """`local_dir` as an absolute path (relative to the current directory); it must exist."""
    path = Path(req.local_dir).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.exists():
        raise DataError(
            f"`{req.key}.local_dir` = {req.local_dir!r}: {str(path)!r} does not exist. Point it to a .txt / "
            ".jsonl prompt file or to a folder holding <split>.txt / <split>_metadata.jsonl."
        )
    return path


def source_folder(req: Request) -> Path:
    """The folder the split files come from: `local_dir` if it is a folder, else the shipped set's folder."""
    if req.local_dir:
        path = _local_path(req)
        if path.is_dir():
            return path
        raise DataError(
            f'`{req.key}.local_dir` = {req.local_dir!r} is a file, but `{req.key}.subset = "generated"` needs a '
            "folder holding test_metadata.jsonl (the GenEval prompts to exclude). Point it to that folder or clear it."
        )
    return shipped_dir(req)


def video_stand_in(req: Request) -> tuple[Path, list[str]]:
    """The file for `name = "dance_grpo_t2v"`: DanceGRPO's prompts when provided, else sanarl's video prompts."""
    provided = split_file(data_root() / "prompts" / VIDEO_STAND_IN, req.split)
    if provided is not None:
        return provided, []
    stand_in = data_root() / "prompts" / f"video_{req.split}.txt"
    if not stand_in.is_file():
        raise DataError(
            f'`{req.key}.name` = "dance_grpo_t2v", split {req.split!r}: neither DanceGRPO\'s prompts '
            f"(prompts/{VIDEO_STAND_IN}/{req.split}.txt under the data root) nor sanarl's {stand_in} exist. Provide "
            "DanceGRPO's assets/video_prompts.txt there (one prompt a line), or set `local_dir` to a prompt file."
        )
    note = (
        f"`{req.key}.name` = \"dance_grpo_t2v\": DanceGRPO's video prompts are not shipped, so sanarl's curated video "
        f"prompts {stand_in.name} stand in. For DanceGRPO's own, save its assets/video_prompts.txt as "
        f"prompts/{VIDEO_STAND_IN}/{req.split}.txt under $SANARL_DATA_DIR (or set `{req.key}.local_dir` to it)."
    )
    return stand_in, [note]


def locate(req: Request) -> Path:
    """The prompt file a file-based request reads."""
    if req.local_dir:
        path = _local_path(req)
        if path.is_file():
            return path
        folder = path
    else:
        folder = shipped_dir(req)
    found = split_file(folder, req.split)
    if found is None:
        raise missing_split(req, folder)
    return found


def check_subset(req: Request) -> None:
    """Reject a subset the request's set does not have."""
    allowed = ["", "filter_nsfw"] + (["generated"] if req.name == "geneval" else [])
    if req.subset not in allowed:
        raise DataError(
            f"`{req.key}.subset` = {req.subset!r} is not available for "
            f"{repr(req.name) if req.name else 'a custom prompt file'}; use one of {allowed} "
            '("filter_nsfw" drops prompts with explicit words, "generated" makes a GenEval train split).'
        )
    if req.size is not None and req.size < 1:
        raise DataError(f"`{req.key}.size` = {req.size}: it must be >= 1, or unset for the whole set.")


def ocr_targets(rows: list[Row]) -> tuple[list[Row], int]:
    """Add `metadata["target"]` = the first double-quoted span (None if none or empty; a row's own kept).

    Returns the new rows and how many have no target. E.g. 'a sign saying "Eat Here" in "red"' -> "Eat Here".
    """
    out, missing = [], 0
    for prompt, metadata in rows:
        if "target" not in metadata:
            match = _QUOTED_RE.search(prompt)
            metadata = {**metadata, "target": (match.group(1) or None) if match else None}
        missing += metadata["target"] is None
        out.append((prompt, metadata))
    return out, missing


def load_file_set(req: Request) -> PromptSet:
    """A shipped or custom prompt file, with the set's row handling, the NSFW filter and the size cap."""
    notes: list[str] = []
    if req.name == VIDEO_STAND_IN and not req.local_dir:
        path, notes = video_stand_in(req)
    else:
        path = locate(req)
    rows = read_prompt_file(path, req)
    stats: dict[str, int] = {"rows_in_file": len(rows)}
    if req.subset == "filter_nsfw":
        kept = [row for row in rows if not is_nsfw(row[0])]
        stats["nsfw_dropped"] = len(rows) - len(kept)
        log.info(
            "diffusion_nft %s: filter_nsfw dropped %d of %d prompts", path, len(rows) - len(kept), len(rows)
        )
        if not kept:
            raise DataError(f"`{req.key}.subset` = 'filter_nsfw' dropped every prompt of {str(path)!r}.")
        rows = kept
    if req.name == "ocr":
        rows, missing = ocr_targets(rows)
        stats["ocr_without_target"] = missing
        if missing:
            log.warning(
                'diffusion_nft %s: %d of %d OCR prompts have no "double-quoted" target',
                path,
                missing,
                len(rows),
            )
    if req.size is not None:
        if req.size > len(rows):
            raise DataError(
                f"`{req.key}.size` = {req.size}, but {str(path)!r} has only {len(rows)} prompts. Lower it or unset "
                "it to use them all."
            )
        rows = rows[: req.size]
    return PromptSet(rows, str(path), stats, notes)


def load_generated(req: Request) -> PromptSet:
    """A GenEval-style train split from `geneval_templates`, disjoint from the geneval test prompts."""
    if req.split != "train":
        raise DataError(
            f'`{req.key}.subset` = "generated" makes a train split (disjoint from the test prompts), but '
            f'`{req.key}.split` = {req.split!r}. Set it to "train", or clear the subset to read the test file.'
        )
    folder = source_folder(req)
    test_file = split_file(folder, "test")
    if test_file is None or test_file.suffix != ".jsonl":
        raise DataError(
            f'`{req.key}.subset` = "generated" excludes the GenEval test prompts, but {str(folder)!r} has no '
            "test_metadata.jsonl. Restore it (sanarl/data/datasets/prompts/geneval/) or point local_dir to a folder with one."
        )
    test = read_jsonl(test_file, _file_key(req), geneval_templates.row_problem)
    size = req.size or DEFAULT_GENERATED_SIZE
    generated = geneval_templates.generate(size, req.seed, {prompt for prompt, _ in test})
    rows = [(r["prompt"], {k: v for k, v in r.items() if k != "prompt"}) for r in generated]
    source = f"geneval templates (seed {req.seed}, {size} rows, excluding {test_file})"
    return PromptSet(rows, source, {"excluded_test_prompts": len({p for p, _ in test})})


def build(req: Request) -> PromptSet:
    """The dataset a request describes (see the module docstring)."""
    if not req.name and not req.local_dir:
        raise DataError(
            f"`{req.key}.name` and `{req.key}.local_dir` are both empty, so sanarl.datasets.diffusion_nft has no "
            f"prompts. Set `{req.key}.name` to one of {list(KNOWN_SETS)}, or `{req.key}.local_dir` to a .txt / "
            ".jsonl prompt file."
        )
    check_name(req)
    check_subset(req)
    if req.subset == "generated":
        return load_generated(req)
    return load_file_set(req)


def get_dataset(config: Config) -> PromptSet:
    """Training prompts from `train.train_policy.dataset` (items `{"prompt": str, "metadata": dict}`).

    Raises:
        ConfigError: when `train.train_policy.type` is "sft" (these sets have prompts, not images).
    """
    if config.train.train_policy.type == "sft" and config.train.train_policy.trainer_type == "dpo":
        raise ConfigError(
            'offline DPO (`train.train_policy.type` = "sft", `trainer_type` = "dpo") trains on preference '
            "pairs, but sanarl.datasets.diffusion_nft gives RL prompt sets (prompts and reward metadata, no images). "
            f"Use a pair plugin, {PAIR_PLUGINS}, or train online from these prompts with "
            '`train.train_policy.type = "grpo"` (e.g. sd35m-dpo-online; docs/dpo.md).'
        )
    if config.train.train_policy.type == "sft":
        raise ConfigError(
            '`train.train_policy.type` = "sft", but sanarl.datasets.diffusion_nft gives RL prompt sets (prompts '
            'and reward metadata, no images). Use it with `train.train_policy.type = "grpo"`, or train SFT on an '
            "image folder with sanarl.datasets.diffusers_dataset."
        )
    return build(Request.of(config.train.train_policy.dataset, TRAIN_KEY, config.train.seed))


def get_val_dataset(config: Config) -> PromptSet | None:
    """Validation prompts from `validation.dataset` (default split "test"); None when name and local_dir are empty."""
    ds = config.validation.dataset
    if not ds.name.strip() and not ds.local_dir.strip():
        return None
    return build(Request.of(ds, VAL_KEY, config.train.seed + 1))
