"""The shipped tiny base models (package data, sanarl/data/models/): their recipes and export.

- `sanarl-tiny:shapes-base` (sanarl/data/models/tiny-shapes-base/): preset `tiny-shapes-sft` (tiny pixel-space SANA from
  scratch on the shapes world), the base of the shapes bench.
- `sanarl-tiny:video-base` (sanarl/data/models/tiny-video-base/): preset `tiny-video-sft` (tiny pixel-space SANA-Video from
  scratch on the moving-shapes world), the base of preset `tiny-video-nft`.

Each is its preset trained for `steps` optimizer steps through `sanarl.api.train`; the EMA weights of the newest
checkpoint are written as a diffusers pipeline directory, transformer in fp16 (a few MB), everything else as the
random-init tiny model (`init`) built it. `scripts/build_shapes_base.py` and `sanarl bench shapes --rebuild-base`
call this module.
"""

from __future__ import annotations

import importlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from sanarl import api
from sanarl.config.presets import data_dir, resolve_preset_path
from sanarl.errors import DataError
from sanarl.methods.config_loading import load_config
from sanarl.models.tiny import ensure_tiny_pipeline
from sanarl.training.run_folder.checkpoint_store import list_checkpoints, load_checkpoint


@dataclass(frozen=True)
class BaseRecipe:
    """How a shipped tiny base is made: `preset` trained `steps` steps from the random-init `sanarl-tiny:<init>`."""

    name: str
    """`sanarl-tiny:<name>`; shipped as sanarl/data/models/tiny-<name>/."""
    preset: str
    init: str
    steps: int
    pipeline_class: str
    """The diffusers pipeline class that loads it."""
    classes_module: str
    """Module whose import registers the tiny model's own classes with diffusers."""

    @property
    def target(self) -> Path:
        return data_dir("models", f"tiny-{self.name}")


SHAPES_BASE = BaseRecipe(
    "shapes-base", "tiny-shapes-sft", "shapes", 3675, "SanaPipeline", "sanarl.models.pixel_ae"
)
VIDEO_BASE = BaseRecipe(
    "video-base", "tiny-video-sft", "shapes-video", 2000, "SanaVideoPipeline", "sanarl.models.tiny_video"
)
RECIPES = {recipe.name: recipe for recipe in (SHAPES_BASE, VIDEO_BASE)}


def train_base(
    run_dir: Path,
    steps: int | None = None,
    overrides: list[str] | None = None,
    recipe: BaseRecipe = SHAPES_BASE,
) -> Path:
    """Run `recipe` for `steps` (default: `recipe.steps`) into `run_dir`, resuming a previous run there; returns
    `run_dir`."""

    sets = [
        f"train.output_dir={run_dir}",
        f"train.max_num_steps={steps or recipe.steps}",
        "train.epoch=100",
        "train.resume=true",
        *(overrides or []),
    ]
    api.train(load_config(resolve_preset_path(recipe.preset), sets), "sanarl.datasets.shapes")
    return run_dir


def export_base(run_dir: Path, target: Path | None = None, recipe: BaseRecipe = SHAPES_BASE) -> Path:
    """EMA weights (else model weights) of the newest checkpoint of `run_dir` -> a pipeline directory `target`
    (default: `recipe.target`)."""
    import diffusers

    importlib.import_module(recipe.classes_module)

    found = list_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        raise DataError(f"{run_dir} has no checkpoints/step_*; train the base first (`train_base`).")
    tensors, _, meta = load_checkpoint(found[-1])
    weights = tensors["ema"] if "ema" in tensors else tensors["model"]
    pipe = getattr(diffusers, recipe.pipeline_class).from_pretrained(str(ensure_tiny_pipeline(recipe.init)))
    missing, unexpected = pipe.transformer.load_state_dict(weights, strict=False)
    params = dict(pipe.transformer.named_parameters())
    if unexpected or [k for k in missing if k in params]:
        raise DataError(
            f"{found[-1]} does not fit the sanarl-tiny:{recipe.init} transformer (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); it was not written by the {recipe.preset} recipe."
        )
    pipe.transformer.to(torch.float16)
    target = Path(target or recipe.target)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    pipe.save_pretrained(str(staging))
    provenance = {
        "preset": recipe.preset,
        "steps": meta["step"],
        "weights": "EMA" if "ema" in tensors else "model",
    }
    (staging / "SANARL_RECIPE.json").write_text(json.dumps(provenance, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
