"""MixGRPO (arXiv 2507.21802; docs/algorithms.md, "MixGRPO"): the sliding window of SDE steps, the rollout grid
with the compressed DPM-Solver++(2M) tail after the window, the mixed sampling loop, and its group advantages.

Convention: ``x_s = (1 - s) x0 + s eps``, sampling from s = 1 down to 0; a grid of N steps has N + 1 levels. The
window ``(a, b)`` holds the grid steps ``a .. b - 1`` (step i goes ``s_i -> s_{i+1}``); those are the stochastic
(Flow-GRPO SDE) steps and the trained steps. The loss is Flow-GRPO's per-step PPO clip
(``sanarl.core.grpo_loss.ppo_clip_loss``). This module imports only sanarl.core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from sanarl.core.samplers import Dpm2State, SampleOutput, dpm2_step, euler_step, flow_sde_step

ADV_STD_EPS = 1e-8


def mixgrpo_window(
    iteration: int, *, num_steps: int, size: int, interval: int, stride: int, roll_back: bool = True
) -> tuple[int, int]:
    """The window ``(a, b)`` of training iteration ``iteration`` (0-based) under the progressive schedule.

    The window start moves by ``stride`` grid steps after every ``interval`` iterations (stride 0: it stays at 0).
    Starts and ends are capped at ``m = num_steps - 2`` (the last two steps are never stochastic); a start past
    ``m`` goes back to 0 with ``roll_back``, else stays at ``m``. ``b = min(a + size, m)``; the window is empty
    (a pure ODE rollout) when ``a = m`` or ``size = 0``.
    """
    if num_steps < 2:
        raise ValueError(f"MixGRPO needs a grid of at least 2 steps, got num_steps = {num_steps}.")
    top = num_steps - 2
    if not 0 <= size <= top:
        raise ValueError(
            f"the MixGRPO window size must be in [0, num_steps - 2 = {top}] (the last two steps are never "
            f"stochastic), got {size}; lower the window size or raise num_steps."
        )
    if interval < 1 or stride < 0 or iteration < 0:
        raise ValueError(
            f"MixGRPO's window schedule needs interval >= 1, stride >= 0 and iteration >= 0, got {interval}, "
            f"{stride}, {iteration}."
        )
    moves = iteration // interval
    if stride == 0:
        start = 0
    elif roll_back:
        start = (moves % (top // stride + 1)) * stride
    else:
        start = min(moves * stride, top)
    return start, min(start + size, top)


def mixgrpo_grid(
    sigmas: Tensor, *, num_steps: int, shift: float, window_end: int, compress_ratio: float | None
) -> Tensor:
    """The grid a MixGRPO rollout runs on: ``sigmas`` (``shift(linspace(1, 0, N + 1), k)``) up to the window's end,
    then, with ``compress_ratio = r``, a coarser tail of ``n = max(int(max((N + 1 - b) r, 1)), 2)`` levels
    ``shift(linspace(t_b, 0, n), k)`` with ``t_b = linspace(1, 0, N + 1)[b]`` (float32 throughout). Without a ratio
    the grid is ``sigmas`` unchanged.
    """
    if sigmas.ndim != 1 or sigmas.shape[0] != num_steps + 1:
        raise ValueError(f"mixgrpo_grid needs sigmas of shape [{num_steps + 1}], got {tuple(sigmas.shape)}.")
    if not 0 <= window_end <= num_steps:
        raise ValueError(f"window_end must be in [0, {num_steps}], got {window_end}.")
    if compress_ratio is None:
        return sigmas
    if not 0 < compress_ratio <= 1:
        raise ValueError(f"compress_ratio must be in (0, 1], got {compress_ratio}.")
    count = max(int(max((num_steps + 1 - window_end) * compress_ratio, 1)), 2)
    t_b = torch.linspace(1, 0, num_steps + 1)[window_end].item()
    tail = torch.linspace(t_b, 0, count)
    tail = (shift * tail) / (1 + (shift - 1) * tail)
    return torch.cat([sigmas[:window_end].to("cpu", torch.float32), tail]).to(sigmas.device)


def mixgrpo_sample_loop(
    velocity_fn: Callable[[Tensor, Tensor], Tensor],
    x_init: Tensor,
    grid: Tensor,
    *,
    window: tuple[int, int],
    eta: float,
    dpm_tail: bool,
    generators: Sequence[torch.Generator] | None = None,
    return_trajectory: bool = False,
) -> SampleOutput:
    """Roll out on ``grid`` (see ``mixgrpo_grid``): Euler before the window, the Flow-GRPO SDE step (``eta``) on
    steps ``a .. b - 1``, then DPM-Solver++(2M) (``dpm_tail``, its memory holding the x0 prediction of step b - 1)
    or Euler. With an empty window and no tail this is the Euler sampler; with the window ``(0, N)`` it is
    Flow-GRPO's all-SDE rollout."""
    a, b = window
    levels = [float(v) for v in grid.detach().to("cpu", torch.float32).tolist()]
    num_steps = len(levels) - 1
    if not 0 <= a <= b <= num_steps:
        raise ValueError(f"window {window} must satisfy 0 <= a <= b <= the grid's {num_steps} steps.")
    batch = x_init.shape[0]
    x, state, log_probs = x_init, None, []
    trajectory = [x_init] if return_trajectory else None
    for i in range(num_steps):
        s, s_next = levels[i], levels[i + 1]
        v = velocity_fn(x, torch.full((batch,), s, dtype=torch.float32, device=x.device))
        if i >= b and dpm_tail:
            x, state = dpm2_step(x, v, s, s_next, state)
        else:
            x0 = x.to(torch.float32) - s * v.to(torch.float32)
            state = Dpm2State(x0=x0, s=torch.full((batch,), s, dtype=torch.float32, device=x.device))
            if a <= i < b:
                x, logp, _, _ = flow_sde_step(
                    x, v, s, s_next, eta=eta, s_first_next=levels[1], generator=generators
                )
                log_probs.append(logp)
            else:
                x = euler_step(x, v, s, s_next)
        if trajectory is not None:
            trajectory.append(x)
    return SampleOutput(
        latents=x,
        trajectory=trajectory,
        log_probs=torch.stack(log_probs, dim=1) if log_probs else None,
        sigmas=grid,
        timesteps_used=list(range(a, b)),
    )


def group_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Advantages ``[N]`` of contiguous groups of ``group_size`` samples: ``(R - mean_g) / (std_g + 1e-8)`` with
    the sample (N - 1) std, in the dtype of ``rewards``."""
    if rewards.ndim != 1 or group_size < 2 or rewards.shape[0] % group_size:
        raise ValueError(
            f"group_advantages needs rewards [N] in whole groups of >= 2, got shape {tuple(rewards.shape)} and "
            f"group_size {group_size}."
        )
    adv = torch.zeros_like(rewards)
    for start in range(0, rewards.shape[0], group_size):
        g = rewards[start : start + group_size]  # one group at a time: the reference's summation order
        adv[start : start + group_size] = (g - g.mean()) / (g.std() + ADV_STD_EPS)
    return adv


def aggregate_advantages(
    rewards: Mapping[str, Tensor], weights: Mapping[str, float], group_size: int
) -> Tensor:
    """MixGRPO's multi-reward advantage (``advantage_aggr``): ``sum_k w_k group_advantages(R_k)``."""
    missing = sorted(set(rewards) ^ set(weights))
    if missing or not rewards:
        raise ValueError(f"aggregate_advantages needs one weight per reward, mismatched keys: {missing}.")
    total = None
    for name, r in rewards.items():
        term = group_advantages(r, group_size) * weights[name]
        total = term if total is None else total + term
    return total
