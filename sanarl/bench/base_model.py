"""The tiny shapes base model (`sanarl-tiny:shapes-base`, models/tiny-shapes-base/): its recipe and export.

Recipe: `presets/tiny-shapes-sft.toml` (tiny pixel-space SANA from scratch on the shapes world) trained for
`steps` optimizer steps through `sanarl.api.train`; the EMA weights of the newest checkpoint are written as a diffusers
pipeline directory, transformer in fp16 (a few MB), everything else as the random-init `sanarl-tiny:shapes` built it.
`scripts/build_shapes_base.py` and `sanarl bench shapes --rebuild-base` call this module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from sanarl.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_TARGET = ROOT / "models" / "tiny-shapes-base"
RECIPE_PRESET = "tiny-shapes-sft"
BASE_STEPS = 3675
"""Steps of the shipped base (docs/results.md)."""


def train_base(run_dir: Path, steps: int = BASE_STEPS, overrides: list[str] | None = None) -> Path:
    """Run the base recipe into `run_dir` (resuming a previous run there); returns `run_dir`."""
    from sanarl import api
    from sanarl.cli import resolve_preset_path
    from sanarl.config import load_config

    sets = [
        f"train.output_dir={run_dir}",
        f"train.max_num_steps={steps}",
        "train.epoch=100",
        "train.resume=true",
        *(overrides or []),
    ]
    api.train(load_config(resolve_preset_path(RECIPE_PRESET), sets), "sanarl.datasets.shapes")
    return run_dir


def export_base(run_dir: Path, target: Path = SHIPPED_TARGET) -> Path:
    """EMA weights (else model weights) of the newest checkpoint of `run_dir` -> a pipeline directory `target`."""
    from diffusers import SanaPipeline

    import sanarl.models.pixel_ae  # noqa: F401  (registers the pixel autoencoder class with diffusers)
    from sanarl.core.checkpoint import list_checkpoints, load_checkpoint
    from sanarl.models.tiny import ensure_tiny_pipeline

    found = list_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        raise DataError(f"{run_dir} has no checkpoints/step_*; train the base first (`train_base`).")
    tensors, _, meta = load_checkpoint(found[-1])
    weights = tensors.get("ema", tensors["model"])
    pipe = SanaPipeline.from_pretrained(str(ensure_tiny_pipeline("shapes")))
    missing, unexpected = pipe.transformer.load_state_dict(weights, strict=False)
    params = dict(pipe.transformer.named_parameters())
    if unexpected or [k for k in missing if k in params]:
        raise DataError(
            f"{found[-1]} does not fit the tiny shapes transformer (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); it was not written by the {RECIPE_PRESET} recipe."
        )
    pipe.transformer.to(torch.float16)
    target = Path(target)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    pipe.save_pretrained(str(staging))
    recipe = {
        "preset": f"presets/{RECIPE_PRESET}.toml",
        "steps": meta["step"],
        "weights": "EMA" if "ema" in tensors else "model",
    }
    (staging / "SANARL_RECIPE.json").write_text(json.dumps(recipe, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
