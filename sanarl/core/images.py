"""Sample grids: images with their prompts (and optional scores) written under each tile."""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] float in [0, 1] -> [B, H, W, 3] uint8."""
    arr = images.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 1).cpu().numpy()


LINE_H = 11
"""Pixels per caption line (PIL's default font)."""
TEXT_H = 34
"""The text band under the tiles holds at least 3 lines; longer captions make it taller."""
MAX_CAPTION_LINES = 12
"""A caption longer than this many lines ends with an ellipsis."""


def caption_lines(caption: str, tile: int) -> list[str]:
    """`caption` wrapped to the width of a `tile`-px tile: whole, up to MAX_CAPTION_LINES lines."""
    lines = textwrap.wrap(caption, width=max(8, tile // 6)) or [""]
    if len(lines) > MAX_CAPTION_LINES:
        lines = [*lines[: MAX_CAPTION_LINES - 1], lines[MAX_CAPTION_LINES - 1][:-1] + "…"]
    return lines


def grid_canvas(
    tiles: np.ndarray, captions: list[str], columns: int, tile: int, title: str = ""
) -> Image.Image:
    """Tiles uint8 [B, H, W, 3] upscaled (nearest) to `tile` px in `columns` columns, each caption below its tile
    (the text band as tall as the longest caption needs), `title` (e.g. the step) in a band above them."""
    rows = (len(tiles) + columns - 1) // columns
    wrapped = [caption_lines(captions[i] if i < len(captions) else "", tile) for i in range(len(tiles))]
    text_h = max(TEXT_H, LINE_H * max((len(w) for w in wrapped), default=1) + 2)
    top = LINE_H + 6 if title else 0
    canvas = Image.new("RGB", (columns * tile, top + rows * (tile + text_h)), "white")
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((3, 3), title, fill="black")
    for i, img in enumerate(tiles):
        x, y = (i % columns) * tile, top + (i // columns) * (tile + text_h)
        canvas.paste(Image.fromarray(img).resize((tile, tile), Image.NEAREST), (x, y))
        draw.multiline_text((x + 2, y + tile + 1), "\n".join(wrapped[i]), fill="black", spacing=0)
    return canvas


def save_grid(
    images: torch.Tensor,
    captions: list[str],
    path: Path,
    *,
    columns: int = 8,
    tile: int = 128,
    title: str = "",
) -> Path:
    """Write a PNG grid; each image is upscaled (nearest) to `tile` px with its caption below, `title` above.

    The PNG goes to a fresh temporary file beside `path`, renamed over it: a link planted at `path` is replaced,
    never written through, and a kill leaves the old grid whole."""
    canvas = grid_canvas(to_uint8(images), captions, columns, tile, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            canvas.save(fh, format="PNG")
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(name, 0o666 & ~mask)  # the modes a plain new file gets (mkstemp makes it 0600)
        os.replace(name, path)
    finally:
        if os.path.exists(name):
            os.unlink(name)
    return path
