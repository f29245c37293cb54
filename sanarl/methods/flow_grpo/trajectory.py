"""Flow-GRPO's rollout pieces: the SDE window, which stored steps train, and the trajectory sampler
(docs/algorithms.md, "Flow-GRPO")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sanarl.core.samplers import initial_noise, sample_loop
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.training.sampling import GenerationSpec, SamplingLoop, generate_latents


@dataclass
class Trajectory:
    """The stored SDE steps of one prompt group (on CPU).

    states: [K, T + 1, ...] x at the start of each stored step, then after the last one (x_a .. x_b).
    log_probs: [K, T] float32 log p(x_{i+1} | x_i) at rollout (the "old" log-probs).
    steps: the T grid indices i (consecutive) of the steps s_i -> s_{i+1}.
    initial: [K, ...] each sample's initial noise x at s_0 = 1 (DDRL's data term draws with it).
    means: [K, T, ...] float32 step means of the rollout policy (GRPO-Guard's old means), None unless asked for.
    """

    states: torch.Tensor
    log_probs: torch.Tensor
    steps: list[int]
    initial: torch.Tensor
    means: torch.Tensor | None = None


def sde_window(
    size: int, window_range: list[int], num_steps: int, rng: torch.Generator
) -> tuple[int, int] | None:
    """Flow-GRPO-Fast window [a, a + size), a uniform in [r0, r1 - size]; None (every step stochastic) if size 0."""
    if size <= 0:
        return None
    r0, r1 = window_range
    if not (0 <= r0 and r0 + size <= r1 <= num_steps):
        raise ValueError(f"window size {size} does not fit in range {window_range} of {num_steps} steps")
    start = r0 + int(torch.randint(r1 - size - r0 + 1, (1,), generator=rng))
    return start, start + size


def trainable_positions(
    steps: list[int], sigmas: torch.Tensor, solver: str, *, cps_last_step: bool = False
) -> list[int]:
    """Positions j of the stored steps whose transition is random: all for flow_sde; for cps all but a step that
    lands on s' = 0 (its std s' sin(eta pi / 2) is 0, the step is deterministic and its rollout log-prob 0),
    unless `cps_last_step` (flow_grpo trains it too, `train_policy.cps_train_last_step`)."""
    if solver == "flow_sde" or cps_last_step:
        return list(range(len(steps)))
    return [j for j, i in enumerate(steps) if float(sigmas[i + 1]) > 0]


def trained_positions(candidates: list[int], levels: int) -> list[int]:
    """The stored-step positions every sample trains, in rollout order: the first `levels` of the random ones
    (the method's plan: a whole Fast window, else flow_grpo's grid steps 0 .. levels - 1)."""
    return list(candidates[:levels])


@torch.no_grad()
def sample_trajectories(
    adapter: DiffusionAdapter,
    cond: Cond,
    seeds: list[int],
    spec: GenerationSpec,
    *,
    uncond: Cond | None,
    window: tuple[int, int] | None,
    same_noise: bool,
    batch_size: int,
    keep_means: bool = False,
    loop: SamplingLoop = sample_loop,
) -> tuple[torch.Tensor, Trajectory]:
    """SDE rollout of one prompt group with the active policy: final latents [K, ...] and the stored steps.

    `sampling.generate_latents` in chunks of `batch_size` seeds, keeping the trajectory's stochastic steps on CPU;
    with `same_noise` every sample starts from the first seed's noise (one initial noise per group); with
    `keep_means` also the stochastic steps' means (GRPO-Guard's old means); `loop` integrates
    (`generate_latents`).
    """
    shape = adapter.latent_shape(spec.height, spec.width)
    a, b = window if window is not None else (0, spec.num_steps)
    shared = initial_noise(shape, seeds[:1], device=adapter.device)[0] if same_noise else None
    finals, states, log_probs, initial, means = [], [], [], [], []
    for first in range(0, len(seeds), batch_size):
        out = generate_latents(
            adapter,
            cond,
            seeds[first : first + batch_size],
            spec,
            uncond=uncond,
            return_trajectory=True,
            window=window,
            start=shared,
            return_means=keep_means,
            loop=loop,
        )
        finals.append(out.latents)
        initial.append(out.trajectory[0].cpu())
        states.append(torch.stack(out.trajectory[a : b + 1], dim=1).cpu())
        log_probs.append(out.log_probs.cpu())
        if keep_means:
            means.append(out.means.cpu())
    trajectory = Trajectory(
        torch.cat(states),
        torch.cat(log_probs),
        list(range(a, b)),
        torch.cat(initial),
        torch.cat(means) if keep_means else None,
    )
    return torch.cat(finals), trajectory
