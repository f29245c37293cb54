"""The sampling grid of every shipped SD3.5-Medium / -Large and FLUX.1-dev preset at the real models' shapes.

The transformer and VAE are built from the real configs (tests/data/real_configs, the checkpoints' config.json
values) on the meta device, with the real scheduler config, inside the real diffusers pipeline class; sanarl's
adapter wraps that pipeline as it wraps a loaded one. For each preset's resolution and step counts (rollout,
evaluation, the Sol-RL preview) the grid sanarl samples on is compared with the one the pipeline's own `__call__`
code builds with its defaults: StableDiffusion3Pipeline's `retrieve_timesteps(scheduler, N)` (no sigmas),
FluxPipeline's `sigmas = linspace(1, 1/N, N)` with `mu = calculate_shift(image_seq_len, ...)` where
image_seq_len is the token count of the latents its `prepare_latents` makes. A preset that names its method's own
grid (`sigma_grid = "linspace"`: MixGRPO's shift(1 - i / N, k)) is compared with that grid, re-derived here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler

from sanarl.methods.config_loading import load_config
from sanarl.models import ADAPTERS, _adapter_class
from sanarl.training.sampling import GenerationSpec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "sanarl" / "presets"
CONFIGS = ROOT / "tests" / "data" / "real_configs"
MODELS = {
    "stabilityai/stable-diffusion-3.5-medium": "stable-diffusion-3.5-medium",
    "stabilityai/stable-diffusion-3.5-large": "stable-diffusion-3.5-large",
    "black-forest-labs/FLUX.1-dev": "FLUX.1-dev",
}


def _presets() -> list[str]:
    out = []
    for path in sorted(PRESETS.glob("*.toml")):
        if load_config(path).config.policy.model_name_or_path in MODELS:
            out.append(path.stem)
    return out


PRESET_NAMES = _presets()


def test_every_real_sd35_and_flux_preset_is_covered():
    prefixes = {name.split("-")[0] for name in PRESET_NAMES}
    assert prefixes == {"sd35m", "sd35l", "flux1"} and len(PRESET_NAMES) >= 15


_PIPELINES: dict[str, object] = {}


def real_pipeline(model: str):
    """The diffusers pipeline of `model` with its real transformer and VAE on the meta device, no text encoders."""
    if model not in _PIPELINES:
        cfg = json.loads((CONFIGS / f"{MODELS[model]}.json").read_text())
        with torch.device("meta"):
            transformer = getattr(diffusers, cfg["transformer"]["_class_name"]).from_config(
                cfg["transformer"]
            )
            vae = AutoencoderKL.from_config(cfg["vae"])
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(cfg["scheduler"])
        pipeline_cls = getattr(diffusers, cfg["pipeline"])
        encoders = {
            name: None
            for name in pipeline_cls._get_signature_keys(pipeline_cls)[0]
            if name.startswith(("text_encoder", "tokenizer"))
        }
        _PIPELINES[model] = pipeline_cls(transformer=transformer, vae=vae, scheduler=scheduler, **encoders)
    return _PIPELINES[model]


def _pipeline_sigmas(pipe, steps: int, height: int, width: int) -> torch.Tensor:
    """The sigmas the pipeline's `__call__` sets with its defaults, by its own module functions."""
    module = __import__(type(pipe).__module__, fromlist=["retrieve_timesteps"])
    if type(pipe).__name__ == "FluxPipeline":
        channels = pipe.transformer.config.in_channels // 4
        latents, _ = pipe.prepare_latents(1, channels, height, width, torch.float32, "meta", None)
        c = pipe.scheduler.config
        mu = module.calculate_shift(
            latents.shape[1], c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift
        )
        module.retrieve_timesteps(
            pipe.scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu
        )
    else:
        assert not pipe.scheduler.config.use_dynamic_shifting  # SD3.5: no mu, the scheduler's own grid
        module.retrieve_timesteps(pipe.scheduler, steps, "cpu")
    return pipe.scheduler.sigmas.clone()


def _linspace_grid(steps: int, k: float) -> torch.Tensor:
    """MixGRPO's grid (its sampling_utils): shift(1 - i / N, k) for i = 0..N-1, then 0, with shift(u, k) =
    k u / (1 + (k - 1) u)."""
    u = np.linspace(1.0, 1.0 / steps, steps)
    return torch.tensor([*(k * u / (1 + (k - 1) * u)), 0.0], dtype=torch.float32)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_preset_grids_are_the_pipelines_default_grids(preset):
    cfg = load_config(PRESETS / f"{preset}.toml").config
    pipe = real_pipeline(cfg.policy.model_name_or_path)
    adapter = _adapter_class(type(pipe).__name__)(pipe, cfg.policy, torch.device("cpu"))
    diffusers_cfg, height_width = cfg.policy.diffusers, cfg.policy.diffusers.inference_size
    specs = [
        GenerationSpec.from_sample_config(diffusers_cfg.sample, adapter, height_width, evaluation=evaluation)
        for evaluation in (False, True)
    ]
    if cfg.rollout.family == "sol_rl":
        specs.append(GenerationSpec(**{**specs[0].__dict__, "num_steps": cfg.rollout.preview_step}))
    sample = diffusers_cfg.sample
    for spec in specs:
        if sample.sigma_grid == "linspace":  # a reference's own grid, named in the preset (MixGRPO's)
            expected = _linspace_grid(spec.num_steps, sample.flow_shift or pipe.scheduler.config.shift)
        else:
            expected = _pipeline_sigmas(pipe, spec.num_steps, *height_width)
        ours = spec.sigmas(adapter)
        assert ours.shape == expected.shape == (spec.num_steps + 1,)
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("model", "size", "shift", "grid", "latent"),
    [
        ("stabilityai/stable-diffusion-3.5-medium", 512, 3.0, "flow_match_euler", (16, 64, 64)),
        ("stabilityai/stable-diffusion-3.5-large", 1024, 3.0, "flow_match_euler", (16, 128, 128)),
        # FLUX.1-dev at 512 px: 64 x 64 latents, 32 x 32 = 1024 packed tokens, mu = 0.5 + 0.65 * 768 / 3840 = 0.63
        ("black-forest-labs/FLUX.1-dev", 512, math.exp(0.63), "linspace", (16, 64, 64)),
        ("black-forest-labs/FLUX.1-dev", 1024, math.exp(1.15), "linspace", (16, 128, 128)),
    ],
)
def test_real_shift_grid_and_latent_shape(model, size, shift, grid, latent):
    cfg = load_config(PRESETS / "sd35m-nft.toml").config
    cfg.policy.model_name_or_path = model
    pipe = real_pipeline(model)
    adapter = _adapter_class(type(pipe).__name__)(pipe, cfg.policy, torch.device("cpu"))
    assert adapter.shift_for(size, size) == pytest.approx(shift, rel=1e-12)
    assert adapter.grid_name() == grid
    assert adapter.latent_shape(size, size) == latent
    if grid == "flow_match_euler":  # the twice-shifted grid: last nonzero level 0.0089 at 10 steps, not 0.25
        assert adapter.sigmas(10, 3.0)[-2].item() == pytest.approx(0.00893, abs=1e-5)


def test_the_real_pipelines_are_the_ones_sanarl_adapts():
    assert {json.loads((CONFIGS / f"{m}.json").read_text())["pipeline"] for m in MODELS.values()} <= set(
        ADAPTERS
    )
