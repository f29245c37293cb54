"""Bucketed image-caption dataset plugin for SOAR (HY-SOAR's data layout; docs/algorithms.md, "SOAR").

Usage: `sanarl --config PRESET sanarl.datasets.soar_jsonl` with `train.train_policy.dataset.local_dir` set.

Layout (docs/soar.md):

    data/
      train.jsonl       one JSON object per line: {"md5": "ab12...", "caption_en": "...", "bw": 1024, "bh": 768}
      images/ab12....jpg

- `local_dir` is the JSONL file, or a directory holding exactly one `*.jsonl` file.
- Images live at `<image_dir>/<md5>.jpg`; `image_dir` is `train.train_policy.dataset.subset` when set (absolute, or
  relative to the JSONL file's folder), else the folder `images/` beside the JSONL file.
- A directory without any `*.jsonl` is read in the SFT folder layout of `sanarl.datasets.diffusers_dataset`
  (`<stem>.json` {"prompt"} + `<stem>.<image>`); all its items form one bucket of `policy.diffusers.inference_size`.
- Caption rule: `caption_en` is either the caption itself or a JSON object (or a string holding one) with several
  captions; then the first non-empty of the long, medium and short caption is used (`CAPTION_PREFERENCE`; a key
  names a level when one of its `_`-separated words is that level, e.g. `long_caption`, `caption_short`), else a
  `caption` key.
- Buckets: every row belongs to the bucket (bh, bw); its image is resized to cover bh x bw (aspect ratio kept) and
  cropped there at a random offset drawn from a generator seeded by (train.seed, epoch, row): the crops are
  deterministic and change from epoch to epoch.
- Bad rows are `DataError`s naming `file:line`. Rows whose image file is missing are skipped and counted
  (`dataset.skipped["missing_image"]`, one warning); more than `MAX_MISSING_FRACTION` missing stops with a
  `DataError`. An image that fails to decode at load time is replaced by the next row of its bucket (counted
  under `skipped["unreadable_at_load"]`, warned once per file).

Batching (the bucket hook): map-style access `dataset[i]` returns one item `{"prompt", "image"}` (epoch-0 crop);
training fetches whole batches through `batch_items(step, rank, world, per_rank)`, which the SOAR task uses when a
dataset defines it. Epoch e of a global batch G = world x per_rank: each bucket's rows are shuffled (seeded by
(seed, e, bucket)), cut into chunks of G (a bucket's remainder of < G rows sits out that epoch), the chunk list is
shuffled (seeded by (seed, e)), and step k uses chunk k mod S of epoch k // S (S = `num_batches(G)`); rank r takes
rows [r per_rank, (r + 1) per_rank) of it. So every batch is from one bucket, ranks never overlap, and the order is a
pure function of (seed, step, rank, world, per_rank): resume needs no saved state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from sanarl.config.schema import Config, DatasetConfig
from sanarl.datasets import common
from sanarl.datasets.diffusers_dataset import pair_stems, read_prompt, scan_dir
from sanarl.errors import DataError

log = logging.getLogger(__name__)

TRAIN_PREFIX = "train.train_policy.dataset"
VAL_PREFIX = "validation.dataset"
CAPTION_PREFERENCE: tuple[str, ...] = ("long", "medium", "short")
"""Which caption of a multi-caption `caption_en` object is used: the first non-empty level in this order."""
MAX_MISSING_FRACTION = 0.05
"""Largest fraction of rows whose image file may be missing before the dataset refuses to start."""
PREVIEW = 5

collate = common.collate


@dataclass(frozen=True)
class Row:
    """One usable data row: caption, bucket size (height, width) in pixels, image file and its origin."""

    caption: str
    height: int
    width: int
    image: Path
    where: str
    """`file:line` of the JSONL row (or the `<stem>.json` file) for messages."""


# --- locating the files -------------------------------------------------------------------------------------------
def _absolute(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


def find_jsonl(local_dir: str, key: str) -> Path | None:
    """The JSONL file named by `local_dir` (the file itself, or the only `*.jsonl` in that directory); None when
    `local_dir` is a directory without any JSONL (the folder layout).

    Raises:
        DataError: naming `key` when `local_dir` is empty or missing, or the directory holds several JSONL files.
    """
    if not local_dir.strip():
        raise DataError(
            f"`{key}` is empty, so sanarl.datasets.soar_jsonl has no data. Set it to a JSONL file of "
            '{"md5", "caption_en", "bw", "bh"} rows (or the folder holding it), e.g. '
            f"`--set {key}=data/train.jsonl`; see docs/soar.md."
        )
    path = _absolute(local_dir)
    if path.is_file():
        return path
    if not path.is_dir():
        raise DataError(f"`{key}` = {local_dir!r}: {str(path)!r} does not exist. Fix the path.")
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".jsonl" and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:PREVIEW])
        raise DataError(
            f"`{key}` = {local_dir!r} holds {len(found)} JSONL files ({names}); point `{key}` at the one to use."
        )
    return found[0] if found else None


def image_dir(jsonl: Path, subset: str, key: str) -> Path:
    """`subset` (absolute or relative to the JSONL's folder) when set, else `images/` beside the JSONL file.

    Raises:
        DataError: naming `key` when the folder does not exist.
    """
    folder = Path(subset).expanduser() if subset.strip() else Path("images")
    folder = folder if folder.is_absolute() else jsonl.parent / folder
    if not folder.is_dir():
        how = f"`{key}` = {subset!r}" if subset.strip() else f"the default image folder (unset `{key}`)"
        raise DataError(
            f"{how}: {str(folder)!r} is not a directory. Images must be at <image_dir>/<md5>.jpg, with image_dir "
            f"the folder `images/` beside {jsonl.name} or `{key}` (absolute, or relative to the JSONL's folder)."
        )
    return folder


# --- parsing rows -------------------------------------------------------------------------------------------------
def _levelled(data: dict[str, Any]) -> str | None:
    """First non-empty caption of `data` by `CAPTION_PREFERENCE`, else its "caption" key, else None."""
    for level in CAPTION_PREFERENCE:
        for k, v in data.items():
            if level in k.lower().split("_") and isinstance(v, str) and v.strip():
                return v.strip()
    plain = data.get("caption")
    return plain.strip() if isinstance(plain, str) and plain.strip() else None


def pick_caption(value: Any, where: str) -> str:
    """The caption of a row's `caption_en` (see the module docstring for the rule).

    Raises:
        DataError: naming `where` when there is no non-empty caption.
    """
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            pass  # a caption that merely starts with "{" is still a caption
    if isinstance(value, dict):
        chosen = _levelled(value)
        if chosen is None:
            raise DataError(
                f"{where}: `caption_en` is an object without a non-empty long / medium / short caption (keys "
                f"{sorted(value)[:8]}); give it e.g. a `long_caption` string, or make `caption_en` the caption."
            )
        return chosen
    if not isinstance(value, str) or not value.strip():
        raise DataError(
            f"{where}: the row has no caption (`caption_en` = {value!r}); every row needs a non-empty "
            "`caption_en` string. Fix or delete the row."
        )
    return value.strip()


def _positive_int(data: dict[str, Any], name: str, where: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DataError(
            f"{where}: `{name}` must be a positive integer (bucket size in pixels), got {value!r}. Fix the row."
        )
    return value


def parse_line(text: str, where: str) -> tuple[str, str, int, int]:
    """(md5, caption, bh, bw) of one JSONL line.

    Raises:
        DataError: naming `where` (`file:line`) for malformed JSON, a missing / unsafe md5, a bad size or caption.
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise DataError(f"{where}: the JSON nests too deeply to read; fix or delete the line.") from None
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{where}: malformed JSON ({exc.msg} at column {exc.colno}). Each line must be one JSON object such as "
            '{"md5": "ab12", "caption_en": "a cat", "bw": 1024, "bh": 1024}; fix or delete the line.'
        ) from None
    if not isinstance(data, dict):
        raise DataError(f"{where}: expected a JSON object per line, got {type(data).__name__}. Fix the line.")
    md5 = data.get("md5")
    if not isinstance(md5, str) or not md5.strip() or "/" in md5 or "\\" in md5 or md5.startswith("."):
        raise DataError(
            f"{where}: `md5` must be the image's file stem (a non-empty name without path separators), got "
            f"{md5!r}. Fix the row."
        )
    caption = pick_caption(data.get("caption_en"), where)
    return md5, caption, _positive_int(data, "bh", where), _positive_int(data, "bw", where)


def read_jsonl(path: Path, images: Path) -> tuple[list[Row], list[str]]:
    """Rows of `path` with their image at `images/<md5>.jpg`, and the `md5`s whose image is missing."""
    rows, missing = [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {str(path)!r} as UTF-8 text ({exc}); check the file.") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        md5, caption, height, width = parse_line(line, where)
        image = images / f"{md5}.jpg"
        if image.is_file():
            rows.append(Row(caption, height, width, image, where))
        else:
            missing.append(md5)
    return rows, missing


def check_missing(rows: list[Row], missing: list[str], source: Path, limit: float) -> None:
    """Warn about rows skipped for a missing image; raise when there are none left or more than `limit` of them."""
    if not missing:
        return
    total = len(rows) + len(missing)
    shown = ", ".join(missing[:PREVIEW]) + (", ..." if len(missing) > PREVIEW else "")
    if not rows or len(missing) > limit * total:
        raise DataError(
            f"{source}: {len(missing)} of {total} rows have no image file <image_dir>/<md5>.jpg (e.g. {shown}); "
            f"more than {limit:.0%} missing usually means a wrong image folder: check "
            f"`{TRAIN_PREFIX}.subset` (default: `images/` beside the JSONL) or restore the files."
        )
    log.warning(
        "soar_jsonl %s: skipped %d of %d rows without an image (%s)", source, len(missing), total, shown
    )


def folder_rows(directory: Path, size: tuple[int, int], key: str) -> list[Row]:
    """The `<stem>.json` + `<stem>.<image>` pairs of `directory`, all in the bucket `size` = (H, W)."""
    jsons, images = scan_dir(directory)
    stems = pair_stems(jsons, images, directory, key)
    return [Row(read_prompt(jsons[s]), size[0], size[1], images[s], str(jsons[s])) for s in stems]


# --- the bucketed order -------------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def bucket_chunks(
    sizes: tuple[int, ...], seed: int, epoch: int, global_batch: int
) -> tuple[tuple[int, ...], ...]:
    """The shuffled chunks of epoch `epoch`, each `global_batch` positions from one bucket.

    Positions index the rows listed bucket after bucket (`sizes[b]` rows in bucket b, so bucket b holds positions
    `sum(sizes[:b])` .. `sum(sizes[:b + 1]) - 1`); a bucket's last `sizes[b] % global_batch` rows of its shuffled
    order sit out the epoch.
    """
    chunks, offset = [], 0
    for b, size in enumerate(sizes):
        gen = torch.Generator().manual_seed(((seed * 1_000_003 + epoch) * 10_007 + b) % 2**62)
        order = (torch.randperm(size, generator=gen) + offset).tolist()
        chunks += [
            tuple(order[i : i + global_batch]) for i in range(0, size - global_batch + 1, global_batch)
        ]
        offset += size
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % 2**62)
    return tuple(chunks[i] for i in torch.randperm(len(chunks), generator=gen).tolist())


class SoarJsonlDataset(Dataset):
    """Caption + image rows in (height, width) buckets, with a deterministic bucketed batch order.

    Args:
        rows: the usable rows.
        seed: `train.seed` (batch order and crops).
        source: the JSONL file or folder, for messages.

    Attributes:
        buckets: (H, W) -> the row indices of that bucket, sorted.
        skipped: "missing_image" (rows left out at construction) and "unreadable_at_load".
    """

    def __init__(self, rows: list[Row], seed: int, source: Path, missing: int = 0) -> None:
        if not rows:
            raise DataError(f"{source}: the dataset has no rows. Add rows or point local_dir elsewhere.")
        self.rows, self.seed, self.source = rows, int(seed), source
        self.buckets: dict[tuple[int, int], list[int]] = {}
        for i, row in enumerate(rows):
            self.buckets.setdefault((row.height, row.width), []).append(i)
        self._keys = sorted(self.buckets)
        self._flat = [i for key in self._keys for i in self.buckets[key]]
        self.skipped = {"missing_image": missing, "unreadable_at_load": 0}
        self._bad: set[int] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """`{"prompt": str, "image": FloatTensor[3, bh, bw] in [0, 1]}` with the epoch-0 crop."""
        n = len(self.rows)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} rows")
        return self.load(index % n, epoch=0)

    def describe_row(self, index: int) -> str:
        """Where row `index` comes from (`file:line`), for messages."""
        return self.rows[index].where

    def load(self, index: int, epoch: int) -> dict[str, Any]:
        """Row `index` with the random crop of `epoch`; an undecodable image is replaced by the next row of its
        bucket (counted in `skipped["unreadable_at_load"]`)."""
        row = self.rows[index]
        members = self.buckets[(row.height, row.width)]
        start = members.index(index)
        for k in range(len(members)):
            i = members[(start + k) % len(members)]
            if i in self._bad:
                continue
            gen = torch.Generator().manual_seed(((self.seed * 1_000_003 + epoch) * 2_147_483_647 + i) % 2**62)
            try:
                image = common.load_image(self.rows[i].image, (row.height, row.width), True, gen)
            except DataError as exc:
                self._bad.add(i)
                self.skipped["unreadable_at_load"] += 1
                log.warning("soar_jsonl: skipping unreadable image (%s): %s", self.rows[i].where, exc)
                continue
            return {"prompt": self.rows[i].caption, "image": image}
        raise DataError(
            f"{self.source}: every image of bucket {row.height}x{row.width} failed to decode; re-export them as JPEG."
        )

    # --- the bucket hook ------------------------------------------------------------------------------------------
    def num_batches(self, global_batch: int) -> int:
        """Batches of `global_batch` rows per epoch: sum over buckets of floor(bucket size / global_batch)."""
        return sum(len(v) // global_batch for v in self.buckets.values())

    def check_batch(self, global_batch: int, key: str = "train.train_batch_per_replica") -> None:
        """Raise unless some bucket fills a batch; warn about the buckets too small to ever be used."""
        small = {k: len(v) for k, v in self.buckets.items() if len(v) < global_batch}
        if len(small) == len(self.buckets):
            biggest = max(len(v) for v in self.buckets.values())
            raise DataError(
                f"{self.source}: no (bh, bw) bucket has `{key}` = {global_batch} rows (the largest has {biggest}); "
                f"every batch comes from one bucket, so lower `{key}` to at most {biggest} or add rows."
            )
        if small:
            shown = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sorted(small.items())[:PREVIEW])
            log.warning(
                "soar_jsonl: %d bucket(s) smaller than one batch are never used: %s", len(small), shown
            )

    def _position(self, step: int, global_batch: int) -> tuple[int, tuple[int, ...]]:
        per_epoch = self.num_batches(global_batch)
        if per_epoch == 0:
            self.check_batch(global_batch)
        epoch, k = divmod(step, per_epoch)
        sizes = tuple(len(self.buckets[key]) for key in self._keys)
        return epoch, bucket_chunks(sizes, self.seed, epoch, global_batch)[k]

    def batch_indices(self, step: int, rank: int, world: int, per_rank: int) -> list[int]:
        """Row indices of (step, rank): one bucket, disjoint across ranks (see the module docstring)."""
        _, chunk = self._position(step, world * per_rank)
        return [self._flat[p] for p in chunk[rank * per_rank : (rank + 1) * per_rank]]

    def batch_items(self, step: int, rank: int, world: int, per_rank: int) -> list[dict[str, Any]]:
        """The items of (step, rank) with the crops of their epoch."""
        epoch, _ = self._position(step, world * per_rank)
        return [self.load(i, epoch) for i in self.batch_indices(step, rank, world, per_rank)]


# --- factories ----------------------------------------------------------------------------------------------------
def build(dataset: DatasetConfig, prefix: str, config: Config) -> SoarJsonlDataset:
    """The dataset described by `dataset` (keys named with `prefix` in messages)."""
    key = f"{prefix}.local_dir"
    jsonl = find_jsonl(dataset.local_dir, key)
    if jsonl is None:
        size = common.check_size(config.policy.diffusers.inference_size)
        folder = _absolute(dataset.local_dir)
        return SoarJsonlDataset(folder_rows(folder, size, key), config.train.seed, folder)
    rows, missing = read_jsonl(jsonl, image_dir(jsonl, dataset.subset, f"{prefix}.subset"))
    check_missing(rows, missing, jsonl, MAX_MISSING_FRACTION)
    return SoarJsonlDataset(rows, config.train.seed, jsonl, missing=len(missing))


def get_dataset(config: Config) -> SoarJsonlDataset:
    """Training rows from `train.train_policy.dataset.local_dir` (and `.subset`); see the module docstring."""
    return build(config.train.train_policy.dataset, TRAIN_PREFIX, config)


def get_val_dataset(config: Config) -> SoarJsonlDataset | None:
    """Validation rows from `validation.dataset.local_dir` in the same layout, or None when it is unset."""
    if not config.validation.dataset.local_dir.strip():
        return None
    return build(config.validation.dataset, VAL_PREFIX, config)
