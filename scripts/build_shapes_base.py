"""Build the shipped tiny shapes base model (`sanarl-tiny:shapes-base`, models/tiny-shapes-base/).

Recipe: `presets/tiny-shapes-sft.toml` (tiny pixel-space SANA from scratch on the shapes world) trained for
`--steps` optimizer steps; the EMA weights of its newest checkpoint are written as a diffusers pipeline, transformer
in fp16 (a few MB), everything else as built.

    python scripts/build_shapes_base.py --steps 1500                       # train, then export
    python scripts/build_shapes_base.py --from-run outputs/base-run        # export an existing run's newest checkpoint
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "tiny-shapes-base"


def train(run_dir: Path, steps: int) -> None:
    cmd = [
        sys.executable, "-m", "sanarl", "--config", str(ROOT / "presets" / "tiny-shapes-sft.toml"),
        "sanarl.datasets.shapes", "--set", f"train.output_dir={run_dir}", "--set", f"train.max_num_steps={steps}",
        "--set", "train.epoch=100", "--set", "train.resume=true",
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def export(run_dir: Path, target: Path = TARGET) -> Path:
    """EMA weights of the newest checkpoint of `run_dir` -> a pipeline directory at `target`."""
    from diffusers import SanaPipeline

    import sanarl.models.pixel_ae  # noqa: F401
    from sanarl.core.checkpoint import list_checkpoints, load_checkpoint
    from sanarl.models.tiny import ensure_tiny_pipeline

    newest = list_checkpoints(run_dir / "checkpoints")[-1]
    tensors, _, meta = load_checkpoint(newest)
    weights = tensors.get("ema", tensors["model"])
    pipe = SanaPipeline.from_pretrained(str(ensure_tiny_pipeline("shapes")))
    missing, unexpected = pipe.transformer.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if k in dict(pipe.transformer.named_parameters())]:
        raise SystemExit(
            f"checkpoint does not fit the tiny shapes transformer: {missing[:3]} {unexpected[:3]}"
        )
    pipe.transformer.to(torch.float16)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    pipe.save_pretrained(str(staging))
    (staging / "SANARL_RECIPE.json").write_text(
        json.dumps(
            {"preset": "presets/tiny-shapes-sft.toml", "steps": meta["step"], "weights": "EMA"}, indent=2
        )
    )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--from-run", type=Path, default=None)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "outputs" / "shapes-base-run")
    args = parser.parse_args()
    run_dir = args.from_run
    if run_dir is None:
        run_dir = args.run_dir
        train(run_dir, args.steps)
    print(f"exported {export(run_dir)}")


if __name__ == "__main__":
    main()
