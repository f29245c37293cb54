"""Build the shipped tiny shapes base model (`sanarl-tiny:shapes-base`, models/tiny-shapes-base/).

A thin wrapper over `sanarl.bench.base_model` (the recipe lives there; `sanarl bench shapes --rebuild-base` runs
the same code into the bench's output directory instead of models/).

    python scripts/build_shapes_base.py --steps 2250                      # train, then export
    python scripts/build_shapes_base.py --from-run outputs/base-run       # export an existing run's newest checkpoint
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sanarl.bench.base_model import BASE_STEPS, ROOT, SHIPPED_TARGET, export_base, train_base


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=BASE_STEPS)
    parser.add_argument("--from-run", type=Path, default=None)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "outputs" / "shapes-base-run")
    parser.add_argument("--target", type=Path, default=SHIPPED_TARGET)
    args = parser.parse_args()
    run_dir = args.from_run or train_base(args.run_dir, args.steps)
    print(f"exported {export_base(run_dir, args.target)}")


if __name__ == "__main__":
    main()
