"""SFT folder dataset plugin in Cosmos-RL's layout: `<stem>.json` with `{"prompt": ...}` beside `<stem>.<image>`.

Usage: `sanarl --config presets/x.toml sanarl.datasets.diffusers_dataset` with
`train.train_policy.dataset.local_dir` (and optionally `validation.dataset.local_dir`) naming a flat folder:

    0001.json   {"prompt": "a red cube on a table"}
    0001.png
    0002.json   {"prompt": "..."}
    0002.jpg

Rules:
- Pairing is by exact stem (`a.json` pairs with `a.png`, never with `a_1.png`), not by sort order. Suffixes
  `.json`, `.jpg`, `.jpeg`, `.png`, `.webp` are matched case-insensitively; dotfiles and subfolders are ignored.
  Items are ordered by stem.
- A json without an image, or an image without a json, is skipped; one warning line gives the counts and the first
  few stems. Two images with one stem (`a.jpg` + `a.png`) are an error: the pairing would be ambiguous.
- Every json is read at construction: malformed json, or a missing / non-string "prompt", is a `DataError`.
- Corrupt images are caught in two places. At construction each paired image goes through PIL's `verify()` (reads
  headers and, for PNG, chunk checksums, without decoding pixels: cheap enough for folders of tens of thousands of
  files); failures are dropped and counted in one warning. `verify()` cannot see every defect (e.g. a truncated
  JPEG body), so a decode failure in `__getitem__` is also skipped: it is counted, warned once per file, and the
  next readable item is returned instead. Nothing left -> `DataError`.
- SFT items: `{"prompt": str, "image": FloatTensor[3, H, W] in [0, 1]}` with [H, W] =
  `policy.diffusers.inference_size` (resize to cover, then center crop; random crop is a constructor flag).
- When `train.train_policy.type` is "grpo" the folder is a prompt set: items are `{"prompt": str, "metadata": {}}`,
  every `<stem>.json` is used and images are neither required nor opened.
- Video folders (`policy.diffusers.is_video`) are not supported yet.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.datasets import common
from sanarl.errors import DataError

log = logging.getLogger(__name__)

TRAIN_KEY = "train.train_policy.dataset.local_dir"
VAL_KEY = "validation.dataset.local_dir"
VIDEO_KEY = "policy.diffusers.is_video"
PREVIEW = 5
"""How many stems a warning lists before '...'."""

collate = common.collate


@dataclass(frozen=True)
class Sample:
    """One dataset entry: its stem, its prompt and (SFT) its image file."""

    stem: str
    prompt: str
    image: Path | None


def _preview(names: list[str]) -> str:
    """'a, b, c' or 'a, b, c, d, e, ...' (at most PREVIEW names)."""
    shown = ", ".join(names[:PREVIEW])
    return shown + (", ..." if len(names) > PREVIEW else "")


def resolve_dir(local_dir: str, key: str) -> Path:
    """Absolute path of the data folder `local_dir` (relative paths are taken from the current directory).

    Raises:
        DataError: naming `key` when `local_dir` is empty, missing or not a directory.
    """
    if not local_dir.strip():
        raise DataError(
            f"`{key}` is empty, so sanarl.datasets.diffusers_dataset has no folder to read. Set it to a directory "
            f'of <stem>.json files ({{"prompt": "..."}}) beside <stem>.jpg|.jpeg|.png|.webp images, in the preset '
            f"or with `--set {key}=path/to/folder`."
        )
    path = Path(local_dir).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.exists():
        raise DataError(f"`{key}` = {local_dir!r}: the directory {str(path)!r} does not exist. Fix the path.")
    if not path.is_dir():
        raise DataError(
            f"`{key}` = {local_dir!r}: {str(path)!r} is not a directory. Point it to the folder that holds the "
            "<stem>.json + <stem>.<image> pairs."
        )
    return path


def scan_dir(directory: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """Map stem -> file for the `.json` files and the image files directly inside `directory`.

    Raises:
        DataError: when two files of the same kind share a stem (e.g. `a.jpg` and `a.png`).
    """
    found: dict[str, dict[str, list[Path]]] = {"json": {}, "image": {}}
    for path in directory.iterdir():
        suffix = path.suffix.lower()
        kind = "json" if suffix == ".json" else "image" if suffix in common.IMAGE_SUFFIXES else None
        if kind is None or path.name.startswith(".") or not path.is_file():
            continue
        found[kind].setdefault(path.stem, []).append(path)
    for kind, by_stem in found.items():
        clashes = {stem: sorted(p.name for p in paths) for stem, paths in by_stem.items() if len(paths) > 1}
        if clashes:
            stem, names = sorted(clashes.items())[0]
            raise DataError(
                f"{str(directory)!r}: {len(clashes)} stem(s) have more than one {kind} file, e.g. {stem!r}: "
                f"{', '.join(names)}. Pairing is by exact stem, so keep one {kind} file per stem."
            )
    return (
        {stem: paths[0] for stem, paths in found["json"].items()},
        {stem: paths[0] for stem, paths in found["image"].items()},
    )


def pair_stems(jsons: dict[str, Path], images: dict[str, Path], directory: Path, key: str) -> list[str]:
    """Sorted stems that have both a json and an image; warn (one line) about the unpaired ones.

    Raises:
        DataError: when no stem has both files, giving how many json and image files were seen.
    """
    paired = sorted(jsons.keys() & images.keys())
    lone_json = sorted(jsons[s].name for s in jsons.keys() - images.keys())
    lone_image = sorted(images[s].name for s in images.keys() - jsons.keys())
    if not paired:
        raise DataError(
            f"`{key}` = {str(directory)!r}: no <stem>.json + <stem>.<image> pairs found (saw {len(jsons)} .json "
            f"and {len(images)} image files). Each image needs a json with the same stem, e.g. 0001.png + "
            '0001.json containing {"prompt": "..."}; images may be .jpg, .jpeg, .png or .webp.'
        )
    if lone_json or lone_image:
        log.warning(
            "diffusers_dataset %s: skipped %d .json without image (%s) and %d image without .json (%s); "
            "using %d pairs",
            directory,
            len(lone_json),
            _preview(lone_json),
            len(lone_image),
            _preview(lone_image),
            len(paired),
        )
    return paired


def read_prompt(path: Path) -> str:
    """The "prompt" string of a `<stem>.json` file.

    Raises:
        DataError: naming the file when it is not valid JSON, not an object, or has no string "prompt".
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(
            f"Cannot read {str(path)!r}: {exc}. Check the file's permissions or delete it."
        ) from exc
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(
            f"Malformed JSON in {str(path)!r}: {exc}. Each <stem>.json must be a UTF-8 JSON object such as "
            '{"prompt": "a red cube"}; fix or delete the file.'
        ) from exc
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if not isinstance(prompt, str):
        what = "has no" if not isinstance(data, dict) or "prompt" not in data else "has a non-string"
        raise DataError(
            f'{str(path)!r} {what} "prompt" field (got {type(prompt).__name__ if prompt is not None else "none"}). '
            'Each <stem>.json must be a JSON object with a string "prompt", e.g. {"prompt": "a red cube"}.'
        )
    return prompt


def drop_unreadable(samples: list[Sample], directory: Path, key: str) -> list[Sample]:
    """Keep the samples whose image passes PIL's `Image.verify()`; warn (one line) about the others.

    Raises:
        DataError: when no image is readable.
    """
    kept, bad = [], []
    for sample in samples:
        try:
            with Image.open(sample.image) as img:
                img.verify()
            kept.append(sample)
        except Exception:  # PIL raises many types (OSError, SyntaxError, struct.error, ...) for broken files
            bad.append(sample.image.name)
    if bad:
        log.warning(
            "diffusers_dataset %s: skipped %d unreadable image(s) (%s)", directory, len(bad), _preview(bad)
        )
    if not kept:
        raise DataError(
            f"`{key}` = {str(directory)!r}: none of the {len(samples)} paired images can be read (all corrupt or "
            "not images). Re-export them as JPEG/PNG/WebP."
        )
    return kept


class DiffusersFolderDataset(Dataset):
    """Prompt + image pairs (SFT) or prompts only (RL) from a Cosmos-RL-style folder.

    Args:
        local_dir: the folder (absolute or relative to the current directory).
        size: [H, W] of the returned images.
        prompts_only: RL mode: use every `<stem>.json`, return `{"prompt", "metadata": {}}`, never open images.
        random_crop: crop at a uniformly random offset (torch's global RNG) instead of the center.
        key: config key named in error messages.

    Attributes:
        samples: the entries in stem order.
        skipped: counts of files left out: "json_without_image", "image_without_json", "unreadable_at_init",
            "unreadable_at_load" (the last grows as `__getitem__` meets undecodable files; per worker process).
    """

    def __init__(
        self,
        local_dir: str,
        size: list[int] | tuple[int, int],
        *,
        prompts_only: bool = False,
        random_crop: bool = False,
        key: str = TRAIN_KEY,
    ) -> None:
        self.directory = resolve_dir(local_dir, key)
        self.size = common.check_size(size)
        self.prompts_only = prompts_only
        self.random_crop = random_crop
        jsons, images = scan_dir(self.directory)
        self.skipped: dict[str, int] = {"unreadable_at_load": 0}
        if prompts_only:
            self.samples = self._prompt_samples(jsons, images, key)
        else:
            self.samples = self._paired_samples(jsons, images, key)
        self._bad: set[int] = set()

    def _prompt_samples(self, jsons: dict[str, Path], images: dict[str, Path], key: str) -> list[Sample]:
        """Every json's prompt, in stem order (RL mode)."""
        if not jsons:
            raise DataError(
                f"`{key}` = {str(self.directory)!r}: no <stem>.json prompt files found (saw {len(images)} image "
                'files). In RL mode (train.train_policy.type = "grpo") each prompt is a <stem>.json containing '
                '{"prompt": "..."}.'
            )
        return [Sample(stem, read_prompt(jsons[stem]), None) for stem in sorted(jsons)]

    def _paired_samples(self, jsons: dict[str, Path], images: dict[str, Path], key: str) -> list[Sample]:
        """The readable json + image pairs, in stem order (SFT mode); fills `skipped`."""
        stems = pair_stems(jsons, images, self.directory, key)
        samples = drop_unreadable(
            [Sample(s, read_prompt(jsons[s]), images[s]) for s in stems], self.directory, key
        )
        self.skipped["json_without_image"] = len(jsons.keys() - images.keys())
        self.skipped["image_without_json"] = len(images.keys() - jsons.keys())
        self.skipped["unreadable_at_init"] = len(stems) - len(samples)
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """`{"prompt": str, "image": FloatTensor[3, H, W] in [0, 1]}`, or `{"prompt": str, "metadata": {}}` (RL).

        An image that fails to decode is skipped (counted, warned once) and the next readable entry is returned.
        """
        n = len(self.samples)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} items")
        if self.prompts_only:
            return {"prompt": self.samples[index].prompt, "metadata": {}}
        for step in range(n):
            i = (index + step) % n
            if i in self._bad:
                continue
            try:
                image = common.load_image(self.samples[i].image, self.size, self.random_crop)
            except DataError as exc:
                self._bad.add(i)
                self.skipped["unreadable_at_load"] += 1
                log.warning("diffusers_dataset: skipping unreadable image: %s", exc)
                continue
            return {"prompt": self.samples[i].prompt, "image": image}
        raise DataError(
            f"{str(self.directory)!r}: every image failed to decode while loading ({len(self._bad)} of {n}). "
            "Re-export the images as JPEG/PNG/WebP."
        )


def _check_image_mode(config: Config) -> None:
    """Reject video configs: this plugin reads image folders only (for now)."""
    if config.policy.diffusers.is_video:
        raise DataError(
            f"`{VIDEO_KEY}` is true, but sanarl.datasets.diffusers_dataset reads image folders only: video folders "
            "(<stem>.mp4 beside <stem>.json) arrive with the SANA-Video support (mp4 decoding). Set "
            f"`{VIDEO_KEY} = false` with an image model, or use a plugin that returns video items."
        )


def get_dataset(config: Config, random_crop: bool = False) -> DiffusersFolderDataset:
    """Training dataset from `train.train_policy.dataset.local_dir` (see the module docstring for the layout).

    SFT items: `{"prompt": str, "image": FloatTensor[3, H, W] in [0, 1]}`, [H, W] = policy.diffusers.inference_size.
    RL (`train.train_policy.type = "grpo"`) items: `{"prompt": str, "metadata": {}}`.
    """
    _check_image_mode(config)
    return DiffusersFolderDataset(
        config.train.train_policy.dataset.local_dir,
        config.policy.diffusers.inference_size,
        prompts_only=config.train.train_policy.type == "grpo",
        random_crop=random_crop,
        key=TRAIN_KEY,
    )


def get_val_dataset(config: Config) -> DiffusersFolderDataset | None:
    """Validation dataset from `validation.dataset.local_dir` (same layout and items), or None when it is unset."""
    local_dir = config.validation.dataset.local_dir
    if not local_dir.strip():
        return None
    _check_image_mode(config)
    return DiffusersFolderDataset(
        local_dir,
        config.policy.diffusers.inference_size,
        prompts_only=config.train.train_policy.type == "grpo",
        key=VAL_KEY,
    )
