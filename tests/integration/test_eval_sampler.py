"""The evaluation sampler on the tiny SANA (docs/algorithms.md, "Evaluation sampler"): Sol-RL's SANA presets
evaluate with the stochastic flow step at noise level 0.7, as Sol-RL's `train_sana.py: eval_fn` calls its sampler
(no `noise_level` / `deterministic` passed: 0.7 / False), re-derived here step by step from the formula of its
"flow" step (`flow_grpo_step`, sigma_max = sigmas[1] where sigma = 1) on the unshifted grid linspace(1, 0, N + 1)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sanarl.methods.config_loading import load_config
from sanarl.models import load_adapter
from sanarl.training.sampling import GenerationSpec, generate_latents

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "sanarl" / "presets"
SOL_RL_SANA = [
    f"sana-image-nft-{f}" for f in ("diffusionnft", "naive_scaling", "compile", "naive_quant", "sol_rl")
]


def _sol_rl_flow_sampling(adapter, cond, seeds: list[int], steps: int, eta: float) -> torch.Tensor:
    """Sol-RL's evaluation: x from each seed's generator, then per step on linspace(1, 0, N + 1)
    std = sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma))) eta, mean = x (1 + std^2 dt / (2 sigma)) +
    v (1 + std^2 (1 - sigma) / (2 sigma)) dt, x' = mean + std sqrt(-dt) z, with z drawn from the seed's generator."""
    shape = adapter.latent_shape(32, 32)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    x = torch.stack([torch.randn(tuple(shape), generator=g) for g in gens])
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    sigma_max = float(sigmas[1])
    for i in range(steps):
        sigma, dt = float(sigmas[i]), float(sigmas[i + 1] - sigmas[i])
        with torch.no_grad():
            v = adapter.velocity(x, torch.full((len(seeds),), sigma), cond).float()
        std = math.sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma))) * eta
        mean = x * (1 + std**2 / (2 * sigma) * dt) + v * (1 + std**2 * (1 - sigma) / (2 * sigma)) * dt
        z = torch.stack([torch.randn(tuple(shape), generator=g) for g in gens])
        x = mean + std * math.sqrt(-dt) * z
    return x


def test_sol_rl_sana_presets_evaluate_with_the_stochastic_flow_step_as_sol_rl():
    tiny = load_config(PRESETS / "tiny-shapes-nft.toml").config
    adapter = load_adapter(tiny.policy)
    for name in SOL_RL_SANA:
        sample = load_config(PRESETS / f"{name}.toml").config.policy.diffusers.sample
        assert (sample.eval_solver, sample.eval_noise_level, sample.eval_num_steps) == (
            "flow_sde",
            0.7,
            40,
        ), name
        rollout = GenerationSpec.from_sample_config(sample, adapter, [32, 32], evaluation=False)
        assert (rollout.solver, rollout.eta) == ("euler", 0.0)  # the rollouts stay deterministic
    spec = GenerationSpec.from_sample_config(sample, adapter, [32, 32], evaluation=True)
    assert (spec.solver, spec.eta, spec.grid) == ("flow_sde", 0.7, "uniform")
    spec = replace(spec, num_steps=6)  # the preset's sampler on 6 steps of the tiny model
    seeds = [3, 11]
    cond = adapter.encode_prompts(["a red circle", "two blue squares"])
    got = generate_latents(adapter, cond, seeds, spec).latents
    want = _sol_rl_flow_sampling(adapter, cond, seeds, 6, 0.7)
    torch.testing.assert_close(got.float(), want, rtol=1e-4, atol=1e-5)
    euler = generate_latents(adapter, cond, seeds, replace(spec, solver="euler", eta=0.0)).latents
    assert float((euler - got).abs().max()) > 0.05  # the noise-free ODE the presets evaluated with before
