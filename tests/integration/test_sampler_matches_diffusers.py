"""sanarl's Euler sampling loop reproduces diffusers' `SanaPipeline.__call__` on the tiny SANA models.

Oracle: the pipeline itself called the way a user calls it, with its own defaults (no `sigmas`, no `timesteps`: its
scheduler's `set_timesteps(N)` grid), fed the adapter's prompt embeddings, the same per-sample seeds
(`generator=[Generator().manual_seed(s), ...]`), CFG with the uncond = encoding of "" (pipeline: w > 1), and
`output_type="latent"`. A second comparison passes `sigmas = linspace(1, 1/N, N)` to the pipeline and
`sample.sigma_grid = "linspace"` to sanarl. The grids are checked on both tiny SANA models, the final latents on
the pixel-space one (the DC-AE one's are the adapter contract's, test_adapter.py). The benchmark
`benchmarks/bench_sampler.py` runs the same comparison at full size (it races the pipeline rather than checking
it, so each keeps its own pipeline call).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sanarl.config.schema import PolicyConfig
from sanarl.training.sampling import GenerationSpec, generate_latents

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

STEPS = 5
SIZE = 32
SEEDS = [11, 12, 13]
PROMPT = "a red circle left of a blue square"
TOLERANCE = 1e-4


def _adapter(model: str):
    from sanarl.models import load_adapter

    policy = PolicyConfig(model_name_or_path=model)
    policy.diffusers.complex_human_instruction = False
    policy.diffusers.max_prompt_length = 16
    adapter = load_adapter(policy)
    adapter.transformer.eval()
    return adapter


@pytest.fixture(scope="module", params=["sanarl-tiny:shapes", "sanarl-tiny:sana-dcae"])
def adapter(request):
    return _adapter(request.param)


@pytest.fixture(scope="module")
def shapes():
    """The pixel-space model; the DC-AE model's samples against the pipeline are the adapter contract's
    (tests/integration/test_adapter.py)."""
    return _adapter("sanarl-tiny:shapes")


def _sanarl(adapter, guidance: float, grid: str | None = None) -> torch.Tensor:
    """Final latents [B, C, h, w] from sanarl's loop on `grid` (None: the adapter's default); one prompt, one seed
    per row."""
    spec = GenerationSpec(
        num_steps=STEPS,
        guidance_scale=guidance,
        solver="euler",
        eta=0.0,
        shift=adapter.default_shift,
        height=SIZE,
        width=SIZE,
        grid=grid,
    )
    cond = adapter.encode_prompts([PROMPT] * len(SEEDS))
    uncond = adapter.encode_prompts([""]) if guidance != 1.0 else None
    return generate_latents(adapter, cond, SEEDS, spec, uncond=uncond).latents


def _diffusers(adapter, guidance: float, **explicit) -> torch.Tensor:
    """Final latents [B, C, h, w] from `SanaPipeline.__call__` with the adapter's embeddings and the pipeline's
    defaults, plus `explicit` arguments (e.g. sigmas)."""
    cond = adapter.encode_prompts([PROMPT] * len(SEEDS))
    extra = {}
    if guidance > 1.0:
        neg = adapter.encode_prompts([""]).expand_to(len(SEEDS))
        extra = {
            "negative_prompt_embeds": neg.embeds.contiguous(),
            "negative_prompt_attention_mask": neg.mask.contiguous(),
        }
    return adapter.pipeline(
        prompt_embeds=cond.embeds,
        prompt_attention_mask=cond.mask,
        negative_prompt=None,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        height=SIZE,
        width=SIZE,
        generator=[torch.Generator().manual_seed(s) for s in SEEDS],
        output_type="latent",
        use_resolution_binning=False,
        **extra,
        **explicit,
    ).images


def test_grid_is_the_pipeline_schedulers_grid(adapter):
    """The scheduler's sigmas after `set_timesteps(N)` (what the pipeline calls without sigmas) are sanarl's grid;
    after `set_timesteps(sigmas=linspace(1, 1/N, N))` they are the "linspace" grid."""
    from sanarl.core.flow import sigma_grid

    sched = adapter.pipeline.scheduler
    assert adapter.grid_name() == "flow_match_euler"
    sched.set_timesteps(STEPS)
    torch.testing.assert_close(sched.sigmas, adapter.sigmas(STEPS, adapter.default_shift), atol=0, rtol=0)
    sched.set_timesteps(sigmas=list(np.linspace(1.0, 1.0 / STEPS, STEPS)))
    torch.testing.assert_close(sched.sigmas, sigma_grid(STEPS, adapter.default_shift), atol=1e-6, rtol=0)


def test_explicit_linspace_sigmas_match_the_linspace_grid(adapter):
    """`sample.sigma_grid = "linspace"` is the pipeline given `sigmas = linspace(1, 1/N, N)`."""
    ours = _sanarl(adapter, 1.0, grid="linspace")
    theirs = _diffusers(adapter, 1.0, sigmas=list(np.linspace(1.0, 1.0 / STEPS, STEPS)))
    assert (ours - theirs).abs().max().item() < TOLERANCE
    assert (ours - _sanarl(adapter, 1.0)).abs().max().item() > 100 * TOLERANCE  # the grid really differs


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_final_latents_match_the_pipeline(shapes, guidance):
    ours, theirs = _sanarl(shapes, guidance), _diffusers(shapes, guidance)
    assert ours.shape == theirs.shape == (len(SEEDS), *shapes.latent_shape(SIZE, SIZE))
    assert torch.isfinite(ours).all()
    assert (ours - theirs).abs().max().item() < TOLERANCE
    # not vacuous: the same prompt with different seeds gives clearly different samples
    for i in range(1, len(SEEDS)):
        assert (ours[i] - ours[0]).abs().max().item() > 1e-2


def test_guidance_changes_the_sample(shapes):
    """CFG is really applied on both sides: w = 4.5 moves the latents away from w = 1 by far more than the tolerance."""
    moved = (_sanarl(shapes, 4.5) - _sanarl(shapes, 1.0)).abs().max().item()
    assert moved > 100 * TOLERANCE
