"""What `sanarl eval` generates for: a prompt file or a named prompt set, each prompt with its reward metadata.

- `--dataset shapes[:split]`: the shapes world (`shapes_world.sample_item(split, seed, i)`, default split "test",
  the held-out combinations); metadata = the GenEval-format row the `shapes` reward judges.
- `--dataset NAME[:split]` with NAME a `sanarl.datasets.diffusion_nft` set (pickscore, geneval, ocr, drawbench):
  that set's split file (default "test"), its metadata (geneval rows, ocr targets).
- `--prompts FILE`: `.txt` (one prompt a line, metadata {}) or `.jsonl` (one object a line: "prompt" plus metadata
  fields, e.g. GenEval rows).

`--num N` takes the first N rows; when N exceeds the rows, the rows repeat in order (GenEval itself draws 4 images
per prompt), each repetition with its own seed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sanarl.errors import DataError
from sanarl.worlds import shapes as world

SHAPES_DEFAULT_NUM = 512
"""Samples of `--dataset shapes` when `--num` is not given (standard error of a strict accuracy ~0.02)."""


@dataclass
class PromptSet:
    """Rows to evaluate: `prompts[i]` with `metadata[i]`; `source` describes where they came from."""

    prompts: list[str]
    metadata: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return len(self.prompts)

    def items(self) -> list[dict[str, Any]]:
        """`{"prompt", "metadata"}` per row ({} where a row has no metadata)."""
        metadata = self.metadata or [{}] * len(self.prompts)
        return [{"prompt": p, "metadata": m} for p, m in zip(self.prompts, metadata, strict=True)]

    def tags(self) -> list[str] | None:
        """GenEval tag of every row, or None unless every row has one."""
        tags = [m.get("tag") for m in self.metadata]
        return tags if tags and all(isinstance(t, str) for t in tags) else None


def shapes_prompts(split: str, num: int, seed: int) -> PromptSet:
    """`num` shapes-world items of `split` (tags balanced, see docs/shapes.md), a pure function of (split, seed)."""
    name = world.canonical_split(split, "--dataset shapes:<split>", example="--dataset shapes:test")
    metas = [world.sample_item(name, seed, i)[0] for i in range(num)]  # GenEval rows, prompt included
    return PromptSet([m["prompt"] for m in metas], metas, f"shapes world, split {name!r}, seed {seed}")


def file_prompts(path: str | Path) -> PromptSet:
    """Rows of a `.txt` / `.jsonl` prompt file (`--prompts`)."""
    from sanarl.datasets.diffusion_nft import read_jsonl, read_txt

    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(
            f"`--prompts {path}`: {file} does not exist or is not a file. Give a .txt file (one prompt a line) or a "
            '.jsonl file (one {"prompt": ..., <metadata>} object a line), or use `--dataset NAME[:split]`.'
        )
    suffix = file.suffix.lower()
    if suffix == ".txt":
        rows = read_txt(file, "--prompts")
    elif suffix == ".jsonl":
        rows = read_jsonl(file, "--prompts")
    else:
        raise DataError(
            f"`--prompts {path}`: {file.name!r} is neither .txt (one prompt a line) nor .jsonl (one "
            '{"prompt": ...} object a line). Rename or convert it.'
        )
    return PromptSet([p for p, _ in rows], [m for _, m in rows], str(file))


def dataset_prompts(spec: str, seed: int, num: int | None) -> PromptSet:
    """`--dataset NAME[:split]`: the shapes world or a diffusion_nft prompt set (default split "test")."""
    from sanarl.datasets import diffusion_nft as nft

    name, _, split = spec.partition(":")
    name, split = name.strip().lower(), (split.strip() or "test")
    if name == "shapes":
        return shapes_prompts(split, num or SHAPES_DEFAULT_NUM, seed)
    if name not in nft.KNOWN_SETS:
        raise DataError(
            f"`--dataset {spec}`: {name!r} is not a known prompt set. Use `shapes[:test|train]` or one of "
            f"{[f'{n}:test' for n in nft.KNOWN_SETS]}, or `--prompts FILE` for your own prompts."
        )
    req = nft.Request(name, "", split, "", None, seed, "--dataset")
    data = nft.build(req)
    return PromptSet([p for p, _ in data.rows], [m for _, m in data.rows], data.source)


def take(rows: PromptSet, num: int | None) -> PromptSet:
    """The first `num` rows (cycling when `num` exceeds them); all rows when `num` is None."""
    if num is None:
        return rows
    if num < 1:
        raise DataError(f"`--num {num}`: the number of samples must be >= 1.")
    index = [i % len(rows) for i in range(num)]
    meta = rows.metadata or [{} for _ in rows.prompts]
    return PromptSet([rows.prompts[i] for i in index], [copy.deepcopy(meta[i]) for i in index], rows.source)


def load_prompts(
    prompts: str | None, dataset: str | None, *, num: int | None = None, seed: int = 0
) -> PromptSet:
    """Exactly one of `prompts` (a file) or `dataset` (`NAME[:split]`) -> the rows to evaluate (`num` of them)."""
    if (prompts is None) == (dataset is None):
        raise DataError(
            "give exactly one of `--prompts FILE` (.txt / .jsonl) or `--dataset NAME[:split]` (e.g. shapes:test, "
            "geneval:test, pickscore:test)."
        )
    rows = file_prompts(prompts) if prompts is not None else dataset_prompts(dataset, seed, num)
    return take(rows, num)
