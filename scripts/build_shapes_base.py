"""Build a shipped tiny base model: `sanarl-tiny:shapes-base` (sanarl/data/models/tiny-shapes-base/, the default) or
`sanarl-tiny:video-base` (sanarl/data/models/tiny-video-base/).

A thin wrapper over `sanarl.bench.base_model` (the recipes live there; `sanarl bench shapes --rebuild-base` runs
the shapes recipe into the bench's output directory instead of sanarl/data/models/).

    python scripts/build_shapes_base.py --steps 2250                      # train, then export
    python scripts/build_shapes_base.py --model video-base                # the moving-shapes video base
    python scripts/build_shapes_base.py --from-run outputs/base-run       # export an existing run's newest checkpoint
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sanarl.bench.base_model import RECIPES, SHAPES_BASE, export_base, train_base

ROOT = Path(__file__).resolve().parents[1]  # the checkout: outputs/ lands beside the README


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(RECIPES), default=SHAPES_BASE.name)
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's (3675 / 2000)")
    parser.add_argument("--from-run", type=Path, default=None)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: outputs/<model>-run")
    parser.add_argument("--target", type=Path, default=None, help="default: sanarl/data/models/tiny-<model>")
    args = parser.parse_args()
    recipe = RECIPES[args.model]
    run_dir = args.from_run or train_base(
        args.run_dir or ROOT / "outputs" / f"{recipe.name}-run", args.steps, recipe=recipe
    )
    print(f"exported {export_base(run_dir, args.target, recipe=recipe)}")


if __name__ == "__main__":
    main()
