"""Write the example SOAR dataset `sanarl/data/datasets/examples/soar/` (JSONL + JPEG images in two buckets), procedurally.

Usage: `python scripts/make_soar_examples.py [--out DIR]`.

Six rows in the layout `sanarl.datasets.soar_jsonl` reads (HY-SOAR's layout, docs/soar.md): `train.jsonl` with
`{"md5", "caption_en", "bw", "bh"}` rows and `images/<md5>.jpg`. Three rows sit in the square bucket bw x bh = 64 x 64
and three in the landscape bucket 96 x 64; every image is drawn at 1.25x its bucket (80 x 80 or 120 x 80 px) so
that loading exercises the resize-to-cover + crop path. Each picture is one or two filled shapes (the shapes-world
palette and background) placed left/right or above/below, and its caption says so in the shapes vocabulary. The
last row's `caption_en` is a JSON string with long / medium / short captions (the multi-caption form).

`md5` is the hex MD5 of `"<caption>|<bw>x<bh>"` (stable across machines, unlike a hash of JPEG bytes, which depend
on the JPEG library). Re-running rewrites the same rows; the JPEG bytes may differ by libjpeg version only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from PIL import Image, ImageDraw

from sanarl.worlds.shapes import BACKGROUND, PALETTE

SCALE = 1.25
"""Image side / bucket side: the files are larger than their bucket, so loading resizes and crops."""

SCENES: tuple[tuple[tuple[int, int], list[tuple[str, str]], str], ...] = (
    ((64, 64), [("red", "circle")], "a red circle"),
    ((64, 64), [("blue", "square"), ("yellow", "triangle")], "a blue square left of a yellow triangle"),
    ((64, 64), [("green", "triangle"), ("red", "square")], "a green triangle above a red square"),
    ((96, 64), [("yellow", "circle"), ("blue", "circle")], "a yellow circle left of a blue circle"),
    ((96, 64), [("green", "square")], "a green square"),
    ((96, 64), [("red", "triangle"), ("green", "circle")], "a red triangle left of a green circle"),
)
"""((bw, bh), [(colour, shape), ...], caption); two shapes are side by side when the caption says "left of", else
stacked."""

MULTI_CAPTION = {
    "long_caption": "a photo of a red triangle on the left side and a green circle on the right side",
    "medium_caption": "a red triangle left of a green circle",
    "short_caption": "red triangle and green circle",
}
"""`caption_en` of the last row, stored as a JSON string (the long caption is the one used)."""


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, float, float, float], rgb) -> None:
    """A filled circle, square or apex-up triangle inside `box` = (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=rgb)
    elif shape == "square":
        draw.rectangle(box, fill=rgb)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=rgb)


def render(size: tuple[int, int], objects: list[tuple[str, str]], caption: str) -> Image.Image:
    """The picture of one scene at `size` = (width, height) px."""
    width, height = size
    image = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(image)
    side = 0.42 * min(width, height) if len(objects) > 1 else 0.6 * min(width, height)
    if len(objects) == 1:
        centres = [(width / 2, height / 2)]
    elif "left of" in caption:
        centres = [(width * 0.28, height / 2), (width * 0.72, height / 2)]
    else:
        centres = [(width / 2, height * 0.27), (width / 2, height * 0.73)]
    for (colour, shape), (cx, cy) in zip(objects, centres, strict=True):
        draw_shape(draw, shape, (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2), PALETTE[colour])
    return image


def rows() -> list[dict]:
    """The JSONL rows, in file order."""
    out = []
    for number, ((bw, bh), _, caption) in enumerate(SCENES):
        caption_en = json.dumps(MULTI_CAPTION) if number == len(SCENES) - 1 else caption
        md5 = hashlib.md5(f"{caption}|{bw}x{bh}".encode()).hexdigest()
        out.append({"md5": md5, "caption_en": caption_en, "bw": bw, "bh": bh})
    return out


def write_examples(out: Path) -> list[Path]:
    """Write `out/train.jsonl` and `out/images/<md5>.jpg`; returns the image paths."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    written = []
    for row, ((bw, bh), objects, caption) in zip(rows(), SCENES, strict=True):
        size = (round(bw * SCALE), round(bh * SCALE))
        path = out / "images" / f"{row['md5']}.jpg"
        render(size, objects, caption).save(path, quality=90)
        written.append(path)
    lines = [json.dumps(row) for row in rows()]
    (out / "train.jsonl").write_text("\n".join(lines) + "\n")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "sanarl/data/datasets/examples/soar"
    )
    args = parser.parse_args()
    for path in write_examples(args.out):
        print(path, f"{path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
