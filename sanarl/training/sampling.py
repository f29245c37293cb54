"""Image / video generation on any adapter: the one sampling path shared by validation, rollouts and `sanarl eval`.

Latents have any rank (`[B, C, h, w]` images, `[B, C, T', h, w]` video); `adapter.latent_shape(H, W)` decides."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from sanarl.config.schema import SampleConfig
from sanarl.core.samplers import SampleOutput, initial_noise, sample_loop
from sanarl.models.base import Cond, DiffusionAdapter


class SamplingLoop(Protocol):
    """A rollout's integration loop, called as `sample_loop` is: `sample_loop` itself, or a method's own (MixGRPO's
    mixed rollout). A loop that cannot keep what is asked (`return_means`) raises rather than ignore it."""

    def __call__(
        self,
        velocity_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        x_init: torch.Tensor,
        sigmas: torch.Tensor,
        *,
        solver: str,
        eta: float,
        generators: Sequence[torch.Generator] | None,
        return_trajectory: bool,
        window: tuple[int, int] | None,
        return_means: bool,
    ) -> SampleOutput: ...


def grid_shift(adapter: DiffusionAdapter, flow_shift: float | None, height: int, width: int) -> float:
    """The grid shift for media of height x width: `sample.flow_shift` when set, else the model's own for that size
    (`adapter.shift_for`)."""
    return flow_shift if flow_shift is not None else adapter.shift_for(height, width)


@dataclass
class GenerationSpec:
    """How to generate: steps, CFG weight, solver (and eta), grid shift, image size [H, W] and the grid's name
    (`sanarl.core.flow.SIGMA_GRIDS`; None = the adapter's pipeline grid)."""

    num_steps: int
    guidance_scale: float
    solver: str
    eta: float
    shift: float
    height: int
    width: int
    grid: str | None = None
    integer_timesteps: bool = False

    @classmethod
    def from_sample_config(
        cls, sample: SampleConfig, adapter: DiffusionAdapter, size: list[int], *, evaluation: bool
    ) -> GenerationSpec:
        """Rollouts: `solver` at `noise_level` (its ODE with `deterministic_sampling`). Evaluation (validation,
        held-out rewards, `sanarl eval`): `eval_solver` (flow_sde at `eval_noise_level`), else the rollout solver's
        noise-free ODE (docs/algorithms.md, "Evaluation sampler")."""
        stochastic = sample.solver in ("flow_sde", "cps")
        if evaluation:
            solver = sample.eval_solver or ("euler" if stochastic else sample.solver)
            eta = sample.eval_noise_level if solver == "flow_sde" else 0.0
        else:
            solver = "euler" if stochastic and sample.deterministic_sampling else sample.solver
            eta = sample.noise_level if solver in ("flow_sde", "cps") else 0.0
        return cls(
            num_steps=sample.eval_num_steps if evaluation else sample.num_steps,
            guidance_scale=sample.guidance_scale,
            solver=solver,
            eta=eta,
            shift=grid_shift(adapter, sample.flow_shift, *size),
            height=size[0],
            width=size[1],
            grid=adapter.grid_name(sample.sigma_grid),
            integer_timesteps=sample.integer_timesteps,
        )

    def sigmas(self, adapter: DiffusionAdapter, *, device: torch.device | str | None = None) -> torch.Tensor:
        """The [N + 1] grid of this spec: rollouts, the levels NFT trains and the steps Flow-GRPO trains use it."""
        return adapter.sigmas(self.num_steps, self.shift, self.grid, device=device)


@torch.no_grad()
def generate_latents(
    adapter: DiffusionAdapter,
    cond: Cond,
    seeds: list[int],
    spec: GenerationSpec,
    *,
    uncond: Cond | None = None,
    return_trajectory: bool = False,
    window: tuple[int, int] | None = None,
    module: torch.nn.Module | None = None,
    start: torch.Tensor | None = None,
    return_means: bool = False,
    loop: SamplingLoop = sample_loop,
) -> SampleOutput:
    """Sample one latent per seed. cond has len(seeds) rows (or 1, broadcast); uncond is used when w != 1;
    `module` samples with another copy of the transformer (default: the trained one, its active adapter).

    `return_trajectory` keeps every state (`SampleOutput.trajectory`); `start` [1, ...] is a start noise every
    sample shares (Flow-GRPO's `same_noise_per_group`) in place of the seeds' own, whose generators still draw the
    stochastic steps' noise; `return_means` keeps the stochastic steps' means (`SampleOutput.means`); `loop`
    integrates (default `sample_loop`)."""
    shape = adapter.latent_shape(spec.height, spec.width)
    x, generators = initial_noise(shape, seeds, device=adapter.device)
    if start is not None:
        x = start.expand_as(x).clone()
    sigmas = spec.sigmas(adapter, device=adapter.device)
    if uncond is None:
        uncond = adapter.uncond_for(spec.guidance_scale)

    def velocity(x_t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return adapter.guided_velocity(x_t, s, cond, uncond, spec.guidance_scale, module)

    with adapter.truncated_timesteps(
        spec.integer_timesteps
    ):  # the model's timestep only; steps keep the float s
        return loop(
            velocity,
            x,
            sigmas,
            solver=spec.solver,
            eta=spec.eta,
            generators=generators,
            return_trajectory=return_trajectory,
            window=window,
            return_means=return_means,
        )


@torch.no_grad()
def generate_images(
    adapter: DiffusionAdapter,
    prompts: list[str],
    seeds: list[int],
    spec: GenerationSpec,
    *,
    batch_size: int = 16,
) -> torch.Tensor:
    """Images [N, 3, H, W] (clips [N, 3, T, H, W] for video adapters) in [0, 1] for prompts[i] with seeds[i], in
    chunks of `batch_size`."""
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = slice(start, start + batch_size)
        cond = adapter.encode_prompts(prompts[chunk])
        latents = generate_latents(adapter, cond, seeds[chunk], spec).latents
        out.append(adapter.decode(latents).cpu())
    return torch.cat(out)
