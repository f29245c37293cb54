"""SFT folder dataset plugin in Cosmos-RL's layout: `<stem>.json` with `{"prompt": ...}` beside `<stem>.<image>`.

Usage: `sanarl --config PRESET sanarl.datasets.diffusers_dataset` with
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
- Video folders (`policy.diffusers.is_video = true`): `<stem>.json` beside `<stem>.mp4` (also `.mov`, `.webm`,
  `.mkv`), decoded with PyAV (`pip install av`). Each item is a contiguous window of `policy.diffusers.train_frames`
  frames, every frame resized to cover [H, W] and center-cropped: `{"prompt": str, "video": FloatTensor[3, T, H, W]
  in [0, 1]}`. The window start is uniform over the valid starts but a pure function of (`train.seed`, item index),
  so resumed runs see exactly the same clips (an item shows the same window in every epoch). At construction every
  video's frame count is probed (header only where the container states it): unreadable files and videos shorter
  than the window are skipped, counted in `skipped` ("unreadable_at_init", "too_short") and reported in one
  warning each; a video that fails to decode later is skipped like a broken image.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.core import media
from sanarl.datasets import common
from sanarl.errors import DataError

log = logging.getLogger(__name__)

TRAIN_KEY = "train.train_policy.dataset.local_dir"
VAL_KEY = "validation.dataset.local_dir"
VIDEO_KEY = "policy.diffusers.is_video"
PREVIEW = 5
"""How many stems a warning lists before '...'."""

collate = common.collate


VIDEO_SUFFIXES: frozenset[str] = frozenset({".mp4", ".mov", ".webm", ".mkv"})
"""Video file suffixes paired with prompts in video mode (compared lower-cased)."""


@dataclass(frozen=True)
class Sample:
    """One dataset entry: its stem, its prompt and (SFT) its image file (its video file in video mode)."""

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


def scan_dir(
    directory: Path, suffixes: frozenset[str] = common.IMAGE_SUFFIXES
) -> tuple[dict[str, Path], dict[str, Path]]:
    """Map stem -> file for the `.json` files and the media files (`suffixes`: images, or VIDEO_SUFFIXES) directly
    inside `directory`.

    Raises:
        DataError: when two files of the same kind share a stem (e.g. `a.jpg` and `a.png`).
    """
    found: dict[str, dict[str, list[Path]]] = {"json": {}, "image": {}}
    for path in directory.iterdir():
        suffix = path.suffix.lower()
        kind = "json" if suffix == ".json" else "image" if suffix in suffixes else None
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
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(
            f"Cannot read {str(path)!r}: {exc}. Check the file's permissions or delete it."
        ) from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
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


def drop_unusable_videos(
    samples: list[Sample], frames: int, directory: Path, key: str
) -> tuple[list[Sample], dict[str, int]]:
    """Keep the samples whose video opens and has at least `frames` frames; one warning per kind of skip.

    Returns (kept, counts {"unreadable_at_init", "too_short"}).
    Raises:
        DataError: when no video is usable (the message says how many were short and how many unreadable).
    """
    kept, bad, short = [], [], []
    for sample in samples:
        try:
            count = media.probe_frames(sample.image)
        except ImportError as exc:
            raise DataError(f"`{key}`: reading videos needs PyAV: {exc}") from None
        except Exception:  # PyAV raises many types (InvalidDataError, IndexError, ...) for broken files
            bad.append(sample.image.name)
            continue
        (kept if count >= frames else short).append(
            sample if count >= frames else f"{sample.image.name} ({count})"
        )
    if bad:
        log.warning(
            "diffusers_dataset %s: skipped %d unreadable video(s) (%s)", directory, len(bad), _preview(bad)
        )
    if short:
        log.warning(
            "diffusers_dataset %s: skipped %d video(s) shorter than train_frames = %d (%s)",
            directory,
            len(short),
            frames,
            _preview(short),
        )
    if not kept:
        raise DataError(
            f"`{key}` = {str(directory)!r}: none of the {len(samples)} paired videos is usable ({len(bad)} unreadable, "
            f"{len(short)} shorter than `policy.diffusers.train_frames` = {frames}). Lower train_frames or add "
            "longer videos (re-encode broken ones as H.264 mp4)."
        )
    return kept, {"unreadable_at_init": len(bad), "too_short": len(short)}


def window_start(total: int, frames: int, seed: int, index: int) -> int:
    """Start of the `frames`-long window of item `index` in a video of `total` frames: uniform over the
    total - frames + 1 valid starts, a pure function of (seed, index)."""
    return int(np.random.default_rng([seed, index]).integers(total - frames + 1))


def load_clip(path: Path, size: tuple[int, int], frames: int, seed: int, index: int) -> torch.Tensor:
    """A window of `frames` frames of a video as a float32 tensor [3, T, H, W] in [0, 1], each frame resized to cover
    `size` and center-cropped.

    Raises:
        DataError: naming the file when it cannot be decoded or has fewer frames than asked.
    """
    try:
        total = media.probe_frames(path)
        start = window_start(total, frames, seed, index) if total >= frames else 0
        clip = media.read_video(path, start, frames)
    except Exception as exc:
        raise DataError(
            f"Cannot decode video file {str(path)!r}: {exc}. Re-encode it (H.264 mp4) or delete it with its .json."
        ) from exc
    if clip.shape[0] < frames:
        raise DataError(
            f"video file {str(path)!r} has {clip.shape[0]} frames, fewer than the {frames} asked for."
        )
    tensors = [common.pil_to_tensor(common.resize_and_crop(Image.fromarray(f), size)) for f in clip]
    return torch.stack(tensors, dim=1)


class DiffusersFolderDataset(Dataset):
    """Prompt + image pairs (SFT) or prompts only (RL) from a Cosmos-RL-style folder.

    Args:
        local_dir: the folder (absolute or relative to the current directory).
        size: [H, W] of the returned images.
        prompts_only: RL mode: use every `<stem>.json`, return `{"prompt", "metadata": {}}`, never open images.
        random_crop: crop at a uniformly random offset (torch's global RNG) instead of the center (images).
        key: config key named in error messages.
        frames: video mode: pair `<stem>.json` with `<stem>.mp4` and return windows of this many frames.
        seed: video mode: the window starts are a pure function of (seed, item index).

    Attributes:
        samples: the entries in stem order.
        skipped: counts of files left out: "json_without_image", "image_without_json", "unreadable_at_init",
            "unreadable_at_load" (the last grows as `__getitem__` meets undecodable files; per worker process), and
            in video mode "too_short".
    """

    def __init__(
        self,
        local_dir: str,
        size: list[int] | tuple[int, int],
        *,
        prompts_only: bool = False,
        random_crop: bool = False,
        key: str = TRAIN_KEY,
        frames: int | None = None,
        seed: int = 0,
    ) -> None:
        self.directory = resolve_dir(local_dir, key)
        self.size = common.check_size(size)
        self.prompts_only = prompts_only
        self.random_crop = random_crop
        self.frames, self.seed = frames, seed
        jsons, images = scan_dir(self.directory, common.IMAGE_SUFFIXES if frames is None else VIDEO_SUFFIXES)
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
        paired = [Sample(s, read_prompt(jsons[s]), images[s]) for s in stems]
        self.skipped["json_without_image"] = len(jsons.keys() - images.keys())
        self.skipped["image_without_json"] = len(images.keys() - jsons.keys())
        if self.frames is not None:
            samples, counts = drop_unusable_videos(paired, self.frames, self.directory, key)
            self.skipped.update(counts)
            return samples
        samples = drop_unreadable(paired, self.directory, key)
        self.skipped["unreadable_at_init"] = len(stems) - len(samples)
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, i: int) -> dict[str, torch.Tensor]:
        """The media of entry i: `{"image": [3, H, W]}` or `{"video": [3, T, H, W]}` (DataError when undecodable)."""
        path = self.samples[i].image
        if self.frames is not None:
            return {"video": load_clip(path, self.size, self.frames, self.seed, i)}
        return {"image": common.load_image(path, self.size, self.random_crop)}

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
                item = self._load(i)
            except DataError as exc:
                self._bad.add(i)
                self.skipped["unreadable_at_load"] += 1
                log.warning("diffusers_dataset: skipping unreadable file: %s", exc)
                continue
            return {"prompt": self.samples[i].prompt, **item}
        raise DataError(
            f"{str(self.directory)!r}: every {'image' if self.frames is None else 'video'} failed to decode while "
            f"loading ({len(self._bad)} of {n}). Re-export the "
            + ("images as JPEG/PNG/WebP." if self.frames is None else "videos as H.264 mp4.")
        )


def _frames(config: Config) -> int | None:
    """`policy.diffusers.train_frames` in video mode (`policy.diffusers.is_video`), else None (image folders)."""
    return config.policy.diffusers.train_frames if config.policy.diffusers.is_video else None


def get_dataset(config: Config, random_crop: bool = False) -> DiffusersFolderDataset:
    """Training dataset from `train.train_policy.dataset.local_dir` (see the module docstring for the layout).

    SFT items: `{"prompt": str, "image": FloatTensor[3, H, W] in [0, 1]}`, [H, W] = policy.diffusers.inference_size
    (video mode: `{"prompt": str, "video": FloatTensor[3, T, H, W]}`, T = policy.diffusers.train_frames).
    RL (`train.train_policy.type = "grpo"`) items: `{"prompt": str, "metadata": {}}`.
    """
    return DiffusersFolderDataset(
        config.train.train_policy.dataset.local_dir,
        config.policy.diffusers.inference_size,
        prompts_only=config.train.train_policy.type == "grpo",
        random_crop=random_crop,
        key=TRAIN_KEY,
        frames=_frames(config),
        seed=config.train.seed,
    )


def read_prompt_list(path: Path, key: str = VAL_KEY) -> list[dict[str, Any]]:
    """Cosmos-RL's validation file: one JSON array of objects with a "prompt" string -> `{"prompt", "metadata"}` items.

    Raises:
        DataError: naming the file (and the entry) when it is not such an array.
    """
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataError(f"`{key}`: cannot read {str(path)!r} as JSON ({type(exc).__name__}: {exc}).") from exc
    if not isinstance(rows, list) or not rows:
        raise DataError(
            f'`{key}`: {str(path)!r} must be a non-empty JSON array such as [{{"prompt": "a red cube"}}, ...] '
            "(Cosmos-RL's validation prompt file), or a folder of <stem>.json + image pairs."
        )
    items = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f'`{key}`: entry {i} of {str(path)!r} has no non-empty "prompt" string.')
        items.append({"prompt": prompt.strip(), "metadata": {}})
    return items


def get_val_dataset(config: Config) -> DiffusersFolderDataset | list[dict[str, Any]] | None:
    """Validation dataset from `validation.dataset.local_dir` (same layout and items), or None when it is unset.

    A `.json` file there is Cosmos-RL's validation format instead: a JSON array of `{"prompt": ...}` objects,
    read as prompt items (validation only needs the prompts).
    """
    local_dir = config.validation.dataset.local_dir
    if not local_dir.strip():
        return None
    path = Path(local_dir).expanduser()
    if path.suffix.lower() == ".json" and path.is_file():
        return read_prompt_list(path)
    return DiffusersFolderDataset(
        local_dir,
        config.policy.diffusers.inference_size,
        prompts_only=config.train.train_policy.type == "grpo",
        key=VAL_KEY,
        frames=_frames(config),
        seed=config.train.seed,
    )
