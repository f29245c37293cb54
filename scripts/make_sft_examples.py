"""Write the example SFT folder `sanarl/data/datasets/examples/sft/` from the shapes-world renderer.

Usage: `python scripts/make_sft_examples.py [--out DIR] [--size 64] [--seed 0] [--per-tag 2]`.

For each of the six GenEval categories (train split) it takes the first `--per-tag` distinct prompts of the
deterministic item stream `sanarl.worlds.shapes.sample_item("train", seed, i)` and writes `<stem>.png` (the ground-truth
render, `--size` px) and `<stem>.json` (`{"prompt": ...}`), the layout `sanarl.datasets.diffusers_dataset` reads.
Stems are `<two-digit number>_<tag>`. Re-running with the same arguments rewrites identical files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image

from sanarl.worlds import shapes as world


def pick_examples(seed: int, per_tag: int) -> list[tuple[dict, int]]:
    """(metadata, render seed) of the first `per_tag` distinct prompts of each tag, in `world.TAGS` order."""
    chosen: dict[str, list[tuple[dict, int]]] = {tag: [] for tag in world.TAGS}
    index = 0
    while any(len(rows) < per_tag for rows in chosen.values()):
        metadata, render_seed = world.sample_item("train", seed, index)
        rows = chosen[metadata["tag"]]
        if len(rows) < per_tag and all(m["prompt"] != metadata["prompt"] for m, _ in rows):
            rows.append((metadata, render_seed))
        index += 1
    return [row for tag in world.TAGS for row in chosen[tag]]


def write_examples(out: Path, size: int, seed: int, per_tag: int) -> list[Path]:
    """Render the examples into `out`; returns the image paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for number, (metadata, render_seed) in enumerate(pick_examples(seed, per_tag)):
        stem = f"{number:02d}_{metadata['tag']}"
        image = Image.fromarray(world.render(metadata, size, render_seed))
        image.save(out / f"{stem}.png", optimize=True)
        (out / f"{stem}.json").write_text(json.dumps({"prompt": metadata["prompt"]}) + "\n")
        written.append(out / f"{stem}.png")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "sanarl/data/datasets/examples/sft"
    )
    parser.add_argument("--size", type=int, default=64, help="image side in px (multiple of 16, >= 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shapes item stream")
    parser.add_argument("--per-tag", type=int, default=2, help="examples per GenEval category")
    args = parser.parse_args()
    for path in write_examples(
        args.out, world.check_image_size(args.size, "--size"), args.seed, args.per_tag
    ):
        print(
            f"{path.with_suffix('.json').name:32s} {json.loads(path.with_suffix('.json').read_text())['prompt']}"
        )


if __name__ == "__main__":
    main()
