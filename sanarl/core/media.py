"""Video files: mp4 read / write through PyAV, and captioned sample grids of clips saved as mp4.

`save_video_grid` is the video twin of `images.save_grid`: clips `[B, 3, T, H, W]` in [0, 1] become one mp4 whose
frame t tiles frame t of every clip (nearest-upscaled to `tile` px) with its caption underneath. `save_media`
picks the PNG grid for images `[B, 3, H, W]` and the mp4 grid for clips, so callers stay family-agnostic.

PyAV is imported lazily (`pip install av`, the `video` extra); a missing PyAV raises ImportError with that command.
H.264 (yuv420p) needs even sizes: odd frames are padded by one replicated row / column before encoding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sanarl.core.images import grid_canvas, save_grid, to_uint8

DEFAULT_FPS = 8


def import_av():
    """The PyAV module, or ImportError naming the pip command."""
    try:
        import av
    except ImportError:
        raise ImportError("video files need PyAV: pip install av  (or pip install 'sanarl[video]')") from None
    return av


def _even(frames: np.ndarray) -> np.ndarray:
    """Pad [T, H, W, 3] to even H and W by replicating the last row / column."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def write_video(path: str | Path, frames: np.ndarray, fps: int = DEFAULT_FPS, crf: int = 18) -> Path:
    """Encode uint8 frames [T, H, W, 3] as an H.264 mp4 at `fps` (quality `crf`, 0 = best); returns the path."""
    av = import_av()
    frames = _even(np.ascontiguousarray(frames, dtype=np.uint8))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def probe_frames(path: str | Path) -> int:
    """Number of video frames of a file (header count, decoded when the container does not state it).

    Raises whatever PyAV raises for unreadable files (callers turn it into a DataError naming the file)."""
    av = import_av()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.frames:
            return int(stream.frames)
        return sum(1 for _ in container.decode(stream))


def read_video(path: str | Path, start: int = 0, count: int | None = None) -> np.ndarray:
    """Decode frames [start, start + count) (all from `start` when count is None) as uint8 [T, H, W, 3] RGB.

    Raises whatever PyAV raises for unreadable files."""
    av = import_av()
    out = []
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i < start:
                continue
            if count is not None and len(out) >= count:
                break
            out.append(frame.to_ndarray(format="rgb24"))
    if not out:
        return np.zeros((0, 0, 0, 3), dtype=np.uint8)
    return np.stack(out)


def save_video_grid(
    clips: torch.Tensor,
    captions: list[str],
    path: Path,
    *,
    columns: int = 8,
    tile: int = 128,
    fps: int = DEFAULT_FPS,
    title: str = "",
) -> Path:
    """Write clips [B, 3, T, H, W] in [0, 1] as one mp4 grid (caption under each tile, `title` above); returns
    the path."""
    if clips.ndim != 5:
        raise ValueError(f"save_video_grid takes clips [B, 3, T, H, W]; got shape {tuple(clips.shape)}")
    columns = max(1, min(columns, len(clips)))
    per_frame = [to_uint8(clips[:, :, t]) for t in range(clips.shape[2])]  # T x [B, H, W, 3]
    frames = np.stack([np.asarray(grid_canvas(f, captions, columns, tile, title)) for f in per_frame])
    return write_video(path, frames, fps=fps)


def save_media(media: torch.Tensor, captions: list[str], stem: Path, **kwargs) -> Path:
    """A PNG grid (`stem`.png) for images [B, 3, H, W] or an mp4 grid (`stem`.mp4) for clips [B, 3, T, H, W]."""
    if media.ndim == 5:
        return save_video_grid(media, captions, stem.with_suffix(".mp4"), **kwargs)
    return save_grid(media, captions, stem.with_suffix(".png"), **kwargs)
