"""Sample grids: images with their prompts (and optional scores) written under each tile."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] float in [0, 1] -> [B, H, W, 3] uint8."""
    arr = images.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 1).cpu().numpy()


def grid_canvas(tiles: np.ndarray, captions: list[str], columns: int, tile: int) -> Image.Image:
    """Tiles uint8 [B, H, W, 3] upscaled (nearest) to `tile` px in `columns` columns, each caption below its tile."""
    rows = (len(tiles) + columns - 1) // columns
    text_h = 34
    canvas = Image.new("RGB", (columns * tile, rows * (tile + text_h)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, img in enumerate(tiles):
        x, y = (i % columns) * tile, (i // columns) * (tile + text_h)
        canvas.paste(Image.fromarray(img).resize((tile, tile), Image.NEAREST), (x, y))
        caption = captions[i] if i < len(captions) else ""
        lines = textwrap.wrap(caption, width=max(8, tile // 6))[:3]
        draw.multiline_text((x + 2, y + tile + 1), "\n".join(lines), fill="black", spacing=0)
    return canvas


def save_grid(
    images: torch.Tensor,
    captions: list[str],
    path: Path,
    *,
    columns: int = 8,
    tile: int = 128,
) -> Path:
    """Write a PNG grid; each image is upscaled (nearest) to `tile` px with its caption below."""
    canvas = grid_canvas(to_uint8(images), captions, columns, tile)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path
