"""The enqueue wire format (docs/reward-service.md, "Wire format"), parsed strictly and without ever unpickling.

Body = `json_bytes + b"\\n" + npy_bytes`:
- JSON object: `prompts` (B strings; Cosmos-RL's GenEval requests may send one `prompt` instead), `reward_fn`
  (`{name: weight}`; sanarl also accepts `{name: {"weight", "video_frame_stride", "video_frame_reduction"}}`,
  the frame options used for videos only), `media_type` (`"image"` | `"video"`; inferred from the array's rank when absent), optional
  `metadata` (one dict per sample, or one dict for all), optional `video_infos` (one dict per video), optional
  `request_id` (makes enqueue idempotent). Any other top-level key (GenEval's `tag`, `include`, ...; OCR's
  `ocr_use_gpu`) is forwarded to the reward in every sample's metadata, as Cosmos-RL does.
- npy (format 1.0 / 2.0, as `np.save(..., allow_pickle=False)` writes): uint8 `[B, H, W, 3]` images or
  `[B, 3, T, H, W]` videos.

The server only reads the npy header (`numpy.lib.format`, which parses it with a literal evaluator) and checks
that the data length is exactly `prod(shape)` bytes; workers decode with `np.load(..., allow_pickle=False)`.
Problems raise `PayloadError` with the HTTP status (413 too large, 422 malformed) and a message naming the field.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from reward_service.config import REWARD_NAME, VIDEO_REDUCTIONS

RESERVED_KEYS = frozenset(
    {"prompts", "prompt", "reward_fn", "media_type", "metadata", "video_infos", "request_id"}
)
"""Top-level JSON keys with a meaning of their own; every other key is forwarded as metadata."""
REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
"""Accepted client request ids (a UUID fits)."""
MAX_NDIM_DIM = 1 << 20
"""No single array dimension may exceed this (guards the byte-count product against absurd headers)."""
SAVED_UINT8_HEADER = re.compile(
    rb"\x93NUMPY\x01\x00..\{'descr': '\|u1', 'fortran_order': False, 'shape': \(([0-9, ]{1,96})\), \}",
    re.DOTALL,
)
"""The start of the npy header `np.save` writes for a C-order uint8 array; `_saved_shape` checks the rest."""
FRAME_OPTIONS = ("video_frame_stride", "video_frame_reduction")
"""Per-reward video options a `reward_fn` object may carry (defaults: the service's `[[reward_args]]`)."""


class PayloadError(ValueError):
    """A request the service refuses: `status` is the HTTP status (413 or 422), the message names the problem."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated enqueue body.

    header: what is stored beside the pixels (`prompts`, `metadata`, `media_type`, `shape`, `rewards`).
    npy: the npy bytes exactly as received (decoded by workers with `decode_array`).
    """

    header: dict[str, Any]
    npy: bytes
    request_id: str | None

    @property
    def rewards(self) -> dict[str, float]:
        """`{reward name: weight}` as sent in `reward_fn`."""
        return self.header["rewards"]

    @property
    def count(self) -> int:
        """B, the number of images (or videos)."""
        return int(self.header["shape"][0])


def parse_enqueue(
    body: bytes,
    *,
    max_images: int,
    max_json_bytes: int,
    known_rewards: Collection[str] | None = None,
) -> EnqueueRequest:
    """Validate an enqueue body (see the module doc); `known_rewards` (None = any name) rejects unknown rewards."""
    newline = body.find(b"\n", 0, max_json_bytes + 1)
    if newline < 0:
        if len(body) > max_json_bytes:
            raise PayloadError(
                f"the JSON header is longer than limits.max_json_bytes = {max_json_bytes} bytes.", 413
            )
        raise PayloadError(
            "the body must be a JSON object, a newline (\\n), then the .npy bytes; no newline was found. Send "
            "json.dumps(data).encode() + b'\\n' + the np.save(..., allow_pickle=False) bytes."
        )
    data = _parse_json(body[:newline])
    npy = body[newline + 1 :]
    shape = _parse_npy_header(npy)
    media_type = _media_type(data, shape)
    count = _check_shape(shape, media_type, max_images)
    rewards, frames = _rewards(data, known_rewards)
    prompts = _prompts(data, count)
    header = {
        "prompts": prompts,
        "metadata": _metadata(data, count),
        "media_type": media_type,
        "shape": list(shape),
        "rewards": rewards,
    }
    if frames and media_type == "video":
        header["frames"] = frames
    return EnqueueRequest(header=header, npy=npy, request_id=_request_id(data))


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PayloadError("the JSON header is not valid UTF-8.") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"the JSON header does not parse: {exc.msg} at character {exc.pos}.") from None
    except RecursionError:
        raise PayloadError("the JSON header is nested too deeply.") from None
    if not isinstance(data, dict):
        raise PayloadError(f"the JSON header must be an object, got {type(data).__name__}.")
    return data


def _parse_npy_header(npy: bytes) -> tuple[int, ...]:
    """Shape of a uint8 npy whose data is exactly `prod(shape)` bytes; reads the header only (no pickle)."""
    saved = _saved_shape(npy)
    if saved is not None:  # the header np.save writes for a C-order uint8 array: nothing else to check in it
        shape, dtype, offset = saved, np.dtype(np.uint8), len(_npy_header(saved))
    else:
        shape, dtype, offset = _read_npy_header(npy)
    if dtype.hasobject:
        raise PayloadError(
            f"the .npy array has dtype {dtype} (Python objects, stored with pickle); the service never unpickles. "
            "Send uint8 pixels."
        )
    if dtype != np.dtype(np.uint8):
        raise PayloadError(
            f"the .npy array has dtype {dtype}; send uint8 pixels (round(255 * x) of [0, 1] images)."
        )
    if any(not isinstance(d, int) or d < 0 or d > MAX_NDIM_DIM for d in shape):
        raise PayloadError(f"the .npy array has an invalid shape {shape}.")
    expected = math.prod(shape)
    data_bytes = len(npy) - offset
    if data_bytes != expected:
        what = "truncated" if data_bytes < expected else "followed by extra bytes"
        raise PayloadError(
            f"the .npy data is {what}: shape {tuple(shape)} needs {expected} bytes, the body holds {data_bytes}."
        )
    return tuple(int(d) for d in shape)


def _saved_shape(npy: bytes) -> tuple[int, ...] | None:
    """The shape of an npy that starts with exactly the header `np.save` writes for a C-order uint8 array of that
    shape (format 1.0, what clients send), else None (then numpy's parser reads it: `_read_npy_header`)."""
    match = SAVED_UINT8_HEADER.match(npy)
    if match is None:
        return None
    shape = tuple(int(d) for d in match[1].split(b",") if d.strip())
    if any(d > MAX_NDIM_DIM for d in shape) or not npy.startswith(_npy_header(shape)):
        return None
    return shape


def _read_npy_header(npy: bytes) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of any npy header numpy reads (format 1.0 or 2.0); PayloadError otherwise."""
    stream = io.BytesIO(npy)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise PayloadError(
                f"npy format version {version} is not accepted; np.save writes 1.0 for uint8 arrays."
            )
    except PayloadError:
        raise
    except Exception as exc:  # numpy's header parser raises ValueError, SyntaxError, tokenize errors, ...
        raise PayloadError(
            f"the bytes after the newline are not a valid .npy array ({type(exc).__name__}: {exc}); write them "
            "with np.save(buffer, array, allow_pickle=False)."
        ) from None
    return shape, dtype, stream.tell()


def _media_type(data: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    media = data.get("media_type", "video" if len(shape) == 5 else "image")
    if media == "latent":
        raise PayloadError(
            "media_type 'latent' (Cosmos-RL's Wan VAE latents) is not supported: send decoded uint8 frames "
            "[B, 3, T, H, W] with media_type 'video'."
        )
    if media not in ("image", "video"):
        raise PayloadError(f"media_type must be 'image' or 'video', got {media!r}.")
    return media


def _check_shape(shape: tuple[int, ...], media_type: str, max_images: int) -> int:
    """B, after checking the layout of `media_type` (images [B, H, W, 3], videos [B, 3, T, H, W])."""
    if media_type == "image" and (len(shape) != 4 or shape[3] != 3):
        raise PayloadError(f"images must be a uint8 array [B, H, W, 3] (channels last), got shape {shape}.")
    if media_type == "video" and (len(shape) != 5 or shape[1] != 3):
        raise PayloadError(f"videos must be a uint8 array [B, 3, T, H, W], got shape {shape}.")
    if shape[0] == 0:
        raise PayloadError("the request holds 0 images; send at least one.")
    if shape[0] > max_images:
        raise PayloadError(
            f"the request holds {shape[0]} items, more than limits.max_images = {max_images}.", 413
        )
    if any(d == 0 for d in shape[1:]):
        raise PayloadError(f"every image dimension must be >= 1, got shape {shape}.")
    return shape[0]


def _rewards(
    data: Mapping[str, Any], known: Collection[str] | None
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """`({name: weight}, {name: frame options})` of `reward_fn`; a value is a weight (Cosmos-RL) or an object
    `{"weight", "video_frame_stride", "video_frame_reduction"}` (sanarl; the frame keys are optional)."""
    fns = data.get("reward_fn")
    if not isinstance(fns, dict) or not fns:
        raise PayloadError('`reward_fn` must be a non-empty object {"reward name": weight}.')
    rewards: dict[str, float] = {}
    frames: dict[str, dict[str, Any]] = {}
    for name, value in fns.items():
        if not REWARD_NAME.fullmatch(name):
            raise PayloadError(f"`reward_fn` has an invalid reward name {name[:80]!r}.")
        weight = value.get("weight", 1.0) if isinstance(value, dict) else value
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise PayloadError(f"`reward_fn[{name!r}]` must be a finite number (the weight), got {weight!r}.")
        rewards[name] = float(weight)
        if isinstance(value, dict):
            options = _frame_options(name, value)
            if options:
                frames[name] = options
    unknown = sorted(set(rewards) - set(known)) if known is not None else []
    if unknown:
        raise PayloadError(
            f"unknown reward(s) {unknown}: this service serves {sorted(known or [])}. Fix `reward_fn`, or enable "
            "the reward in the service's rewards.toml."
        )
    return rewards, frames


def _frame_options(name: str, value: Mapping[str, Any]) -> dict[str, Any]:
    """The video frame options of one `reward_fn` object (see `_rewards`), checked."""
    extra = sorted(set(value) - {"weight", *FRAME_OPTIONS})
    if extra:
        raise PayloadError(
            f"`reward_fn[{name!r}]` has unknown keys {extra}; allowed: weight, {', '.join(FRAME_OPTIONS)}."
        )
    options = {key: value[key] for key in FRAME_OPTIONS if key in value}
    stride = options.get("video_frame_stride", 1)
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= MAX_NDIM_DIM:
        raise PayloadError(
            f"`reward_fn[{name!r}].video_frame_stride` must be an integer >= 1, got {stride!r}."
        )
    reduction = options.get("video_frame_reduction", "mean")
    if reduction not in VIDEO_REDUCTIONS:
        raise PayloadError(
            f"`reward_fn[{name!r}].video_frame_reduction` must be one of {list(VIDEO_REDUCTIONS)}, got {reduction!r}."
        )
    return options


def _prompts(data: Mapping[str, Any], count: int) -> list[str]:
    prompts = data.get("prompts")
    if prompts is None and isinstance(data.get("prompt"), str):
        prompts = [data["prompt"]] * count
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise PayloadError("`prompts` must be a list of strings, one per image.")
    if len(prompts) != count:
        raise PayloadError(
            f"`prompts` has {len(prompts)} entries but the array holds {count} images; send one each."
        )
    return prompts


def _metadata(data: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """One dict per sample: `metadata` (list or shared dict) + forwarded top-level keys + `video_infos[i]`."""
    meta = data.get("metadata")
    if meta is None:
        rows: list[dict[str, Any]] = [{} for _ in range(count)]
    elif isinstance(meta, dict):
        rows = [dict(meta) for _ in range(count)]
    elif isinstance(meta, list) and len(meta) == count and all(isinstance(m, dict) for m in meta):
        rows = [dict(m) for m in meta]
    else:
        raise PayloadError(f"`metadata` must be one object per image ({count}) or a single object for all.")
    extra = {k: v for k, v in data.items() if k not in RESERVED_KEYS}
    infos = data.get("video_infos")
    if infos is not None and (not isinstance(infos, list) or len(infos) != count):
        raise PayloadError(f"`video_infos` must be a list of {count} objects, one per video.")
    for i, row in enumerate(rows):
        for key, value in extra.items():
            row.setdefault(key, value)
        if infos is not None:
            row.setdefault("video_info", infos[i])
    return rows


def _request_id(data: Mapping[str, Any]) -> str | None:
    rid = data.get("request_id")
    if rid is None:
        return None
    if not isinstance(rid, str) or not REQUEST_ID.fullmatch(rid):
        raise PayloadError(
            "`request_id` must be 1-128 characters of letters, digits and `._:-` (e.g. a UUID)."
        )
    return rid


def decode_array(npy: bytes, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    """Worker side: the uint8 array of an accepted request, as `np.load(allow_pickle=False)` reads it, shape
    re-checked. The npy `np.save` writes for that shape (format 1.0, C order) is read directly after its header,
    without parsing the header again (the API did, at enqueue)."""
    header = _npy_header(tuple(int(d) for d in shape))
    if npy.startswith(header) and len(npy) == len(header) + math.prod(shape):
        return np.frombuffer(npy, np.uint8, offset=len(header)).reshape(shape).copy()
    array = np.load(io.BytesIO(npy), allow_pickle=False)
    if array.dtype != np.uint8 or tuple(array.shape) != tuple(shape):
        raise PayloadError(
            f"stored array has dtype {array.dtype} shape {array.shape}, expected uint8 {tuple(shape)}."
        )
    return np.ascontiguousarray(array)


@functools.lru_cache(maxsize=256)
def _npy_header(shape: tuple[int, ...]) -> bytes:
    """The header `np.save` writes for a C-order uint8 array of `shape` (format 1.0)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def encode_body(header: Mapping[str, Any], array: np.ndarray) -> bytes:
    """Client side: `json + b"\\n" + npy` (the npy written with allow_pickle=False)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return json.dumps(header, separators=(",", ":"), allow_nan=False).encode() + b"\n" + buffer.getvalue()
