"""The shipped tiny base models (sanarl/data/models/) and the recipe code that exports them (sanarl/bench/base_model.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from sanarl.bench.base_model import RECIPES, SHAPES_BASE, VIDEO_BASE, export_base
from sanarl.errors import DataError
from sanarl.models.tiny import SHIPPED, ensure_tiny_pipeline
from sanarl.training.run_folder.checkpoint_store import save_checkpoint


def _transformer_config(path) -> dict:
    config = json.loads((path / "transformer" / "config.json").read_text())
    return {k: v for k, v in config.items() if not k.startswith("_")}


@pytest.mark.parametrize("recipe", [SHAPES_BASE, VIDEO_BASE], ids=lambda r: r.name)
def test_shipped_base_is_its_recipe_on_its_init_architecture(recipe):
    path = ensure_tiny_pipeline(recipe.name)
    assert SHIPPED[recipe.name] == path.name == f"tiny-{recipe.name}"
    provenance = json.loads((path / "SANARL_RECIPE.json").read_text())
    assert provenance == {"preset": recipe.preset, "steps": recipe.steps, "weights": "EMA"}
    assert _transformer_config(path) == _transformer_config(ensure_tiny_pipeline(recipe.init))
    model_index = json.loads((path / "model_index.json").read_text())
    assert model_index["_class_name"] == recipe.pipeline_class


def test_video_recipe_exports_the_ema_weights_in_fp16_as_a_loadable_pipeline(tmp_path):
    from diffusers import SanaVideoPipeline

    from sanarl.models.tiny_video import PositionalSanaVideoTransformer3DModel

    init = SanaVideoPipeline.from_pretrained(str(ensure_tiny_pipeline(VIDEO_BASE.init)))
    generator = torch.Generator().manual_seed(0)
    ema = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator)
        for k, v in init.transformer.state_dict().items()
    }
    model = {k: torch.zeros_like(v) for k, v in ema.items()}
    save_checkpoint(tmp_path / "run" / "checkpoints", 7, {"ema": ema, "model": model}, {}, {})

    target = export_base(tmp_path / "run", tmp_path / "base", recipe=VIDEO_BASE)

    provenance = json.loads((target / "SANARL_RECIPE.json").read_text())
    assert provenance == {"preset": "tiny-video-sft", "steps": 7, "weights": "EMA"}
    stored = load_file(str(target / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert stored.keys() == ema.keys()
    for key, value in stored.items():
        assert value.dtype == torch.float16
        torch.testing.assert_close(value, ema[key].half())  # the EMA weights, not `model`
    loaded = SanaVideoPipeline.from_pretrained(str(target))
    assert type(loaded.transformer) is PositionalSanaVideoTransformer3DModel
    assert not (tmp_path / "base.tmp").exists()


def test_export_refuses_a_checkpoint_of_another_architecture(tmp_path):
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, {"model": {"w": torch.zeros(2)}}, {}, {})
    with pytest.raises(
        DataError, match=r"does not fit the sanarl-tiny:shapes-video transformer.*tiny-video-sft"
    ):
        export_base(tmp_path / "run", tmp_path / "base", recipe=RECIPES["video-base"])
    assert not (tmp_path / "base").exists()
