"""Rectified-flow conventions shared by every model family (docs/algorithms.md, "Conventions").

One convention for the whole project:

- noisy sample ``x_s = (1 - s) * x0 + s * eps`` with the noise level ``s`` (sigma) in [0, 1], ``s = 1`` pure noise;
- velocity target ``v* = eps - x0``; clean estimate from any velocity ``x0_hat = x_s - s * v``;
- sampling runs ``s`` from 1 down to 0 (``x' = x + v * (s' - s)`` for Euler, see ``samplers``);
- the model sees the float timestep ``1000 * s`` (sampling truncates it to an integer only with
  ``sample.integer_timesteps``, DiffusionNFT's SD3 rollout convention, applied by the adapter);
- sampling grids follow the family's diffusers pipeline (``grid`` by name: its scheduler's own grid, or FLUX's
  explicit ``linspace``).

Everything here is a pure function of tensors; this module imports nothing else of sanarl.
"""

from __future__ import annotations

import torch
from torch import Tensor

SigmaLike = float | Tensor
"""A noise level: a Python float, a 0-d tensor, or a per-sample ``[B]`` tensor."""

TIMESTEP_SCALE = 1000.0
"""Model timestep per unit of sigma (``t = 1000 * s``), the scale diffusers' flow schedulers use."""


def broadcast_sigma(s: SigmaLike, x: Tensor, *, dtype: torch.dtype | None = None) -> Tensor:
    """Shape a noise level so it broadcasts against ``x``.

    Args:
        s: float, 0-d tensor, or ``[B]`` (or ``[1]``) tensor of noise levels.
        x: ``[B, ...]`` tensor whose shape and device the result follows.
        dtype: dtype of the result; default ``x.dtype``.

    Returns:
        ``[B, 1, ..., 1]`` (or ``[1, ..., 1]`` for a scalar) tensor with ``x.ndim`` dims on ``x.device``.
    """
    s_t = torch.as_tensor(s, dtype=dtype or x.dtype, device=x.device)
    if s_t.ndim == 0:
        return s_t.reshape([1] * x.ndim)
    if s_t.ndim != 1 or s_t.shape[0] not in (1, x.shape[0]):
        raise ValueError(
            f"sigma of shape {tuple(s_t.shape)} does not match a batch of shape {tuple(x.shape)}: pass a float, "
            f"a 0-d tensor or a [B] tensor with B = {x.shape[0]}."
        )
    return s_t.reshape([s_t.shape[0]] + [1] * (x.ndim - 1))


def interpolate(x0: Tensor, eps: Tensor, s: SigmaLike) -> Tensor:
    """Forward (noising) process of rectified flow: ``x_s = (1 - s) x0 + s eps``.

    Args:
        x0: ``[B, ...]`` clean latents.
        eps: ``[B, ...]`` standard normal noise, same shape as ``x0``.
        s: float or ``[B]`` noise levels in [0, 1]; ``s = 0`` returns ``x0``, ``s = 1`` returns ``eps``.

    Returns:
        ``[B, ...]`` noisy latents in ``x0.dtype``.
    """
    s_b = broadcast_sigma(s, x0)
    return (1 - s_b) * x0 + s_b * eps


def velocity_target(x0: Tensor, eps: Tensor) -> Tensor:
    """Flow-matching regression target ``v* = eps - x0`` (``d x_s / d s``), shape ``[B, ...]``."""
    return eps - x0


def x0_from_velocity(x_s: Tensor, s: SigmaLike, v: Tensor) -> Tensor:
    """Clean estimate implied by a velocity: ``x0_hat = x_s - s v``.

    Args:
        x_s: ``[B, ...]`` noisy latents at level ``s``.
        s: float or ``[B]`` noise levels.
        v: ``[B, ...]`` velocity prediction.

    Returns:
        ``[B, ...]``; exact (``x0``) when ``v = eps - x0`` and ``x_s`` lies on the straight path.
    """
    return x_s - broadcast_sigma(s, x_s) * v


def shift_sigmas(u: Tensor | float, k: float) -> Tensor | float:
    """Timestep shift of SD3 (Esser et al. 2024, eq. 23): ``shift(u, k) = k u / (1 + (k - 1) u)``.

    Maps [0, 1] onto [0, 1] monotonically, keeping 0 and 1 fixed; ``k > 1`` spends more of the grid at high
    noise, ``k = 1`` is the identity. Works elementwise on tensors of any shape (or on a float).
    """
    if k <= 0:
        raise ValueError(f"shift k must be > 0 (got {k}); use 1.0 for no shift.")
    return k * u / (1 + (k - 1) * u)


def _check_steps(num_steps: int) -> int:
    if int(num_steps) != num_steps or num_steps < 1:
        raise ValueError(
            f"num_steps must be an integer >= 1 (got {num_steps}); set sample.num_steps to e.g. 10."
        )
    return int(num_steps)


def _with_terminal_zero(levels: Tensor, device: torch.device | str | None) -> Tensor:
    """float64 levels -> ``[N + 1]`` float32 grid with a terminal 0 (the cast first, as diffusers does)."""
    grid = torch.cat([levels.to(torch.float32), torch.zeros(1, dtype=torch.float32)])
    return grid.to(device=device)


def sigma_grid(num_steps: int, shift: float, *, device: torch.device | str | None = None) -> Tensor:
    """The ``linspace`` grid: ``s_i = shift(1 - i / N, k)``, i = 0..N-1, then a terminal ``0``.

    This is FluxPipeline's default grid (it passes ``sigmas = linspace(1, 1/N, N)`` to its scheduler, which shifts
    them once, with ``k = exp(mu)``), and the grid of any ``set_timesteps(sigmas=linspace(1, 1/N, N))`` call.
    StableDiffusion3Pipeline and SanaPipeline called without ``sigmas`` use their scheduler's own grid instead
    (``flow_match_euler_grid``, ``dpm_flow_grid``); ``grid`` picks by name.

    Args:
        num_steps: N >= 1, the number of solver steps.
        shift: k > 0.
        device: where to put the result.

    Returns:
        ``[N + 1]`` float32 tensor, ``grid[0] = 1``, ``grid[N] = 0``, strictly decreasing.
        E.g. N = 4, k = 3: ``[1, 0.9, 0.75, 0.5, 0]``.
    """
    n = _check_steps(num_steps)
    u = torch.linspace(1.0, 1.0 / n, n, dtype=torch.float64)
    return _with_terminal_zero(shift_sigmas(u, float(shift)), device)


def flow_match_euler_grid(
    num_steps: int,
    shift: float,
    *,
    num_train_timesteps: int = 1000,
    device: torch.device | str | None = None,
) -> Tensor:
    """The grid of diffusers' ``FlowMatchEulerDiscreteScheduler.set_timesteps(N)`` (static shift k, no sigmas).

    The scheduler keeps a training table ``T_j = shift(j / T, k)``, j = T..1 (float32, T = num_train_timesteps),
    and spaces the N levels linearly between its ends, then shifts them a second time:
    ``s_i = shift(T_max + (T_min - T_max) i / (N - 1), k)``, i = 0..N-1, then a terminal 0. With k = 3, N = 10 the
    last nonzero level is 0.0089 (the ``linspace`` grid's is 0.25). This is the grid StableDiffusion3Pipeline,
    SanaPipeline and SanaVideoPipeline sample on when called without ``sigmas``, and the one flow_grpo,
    DiffusionNFT and Sol-RL's SD3 sampler use.

    Returns:
        ``[N + 1]`` float32 tensor from 1 down to 0, strictly decreasing.
    """
    n = _check_steps(num_steps)
    table = torch.tensor([1.0, 1.0 / num_train_timesteps], dtype=torch.float32)  # the table's two ends
    table = shift_sigmas(table, float(shift))
    hi, lo = (float(v) for v in table)
    u = torch.linspace(hi, lo, n, dtype=torch.float64)
    return _with_terminal_zero(shift_sigmas(u, float(shift)), device)


def dpm_flow_grid(
    num_steps: int,
    shift: float,
    *,
    num_train_timesteps: int = 1000,
    device: torch.device | str | None = None,
) -> Tensor:
    """The grid of diffusers' ``DPMSolverMultistepScheduler.set_timesteps(N)`` with ``use_flow_sigmas`` (the
    scheduler of SANA's diffusers checkpoints that ship DPM-Solver): ``s_i = shift((1 - 1/T)(1 - i / N), k)``,
    i = 0..N-1, then a terminal 0. It starts just below 1 (``shift(0.999, k)``); sampling still starts from pure
    noise, as the pipeline does.
    """
    n = _check_steps(num_steps)
    u = torch.linspace(0.0, 1.0 - 1.0 / num_train_timesteps, n + 1, dtype=torch.float64)
    levels = torch.flip(shift_sigmas(u, float(shift)), [0])[:-1]
    return _with_terminal_zero(levels, device)


SIGMA_GRIDS = {
    "linspace": lambda n, k, t, device: sigma_grid(n, k, device=device),
    "flow_match_euler": lambda n, k, t, device: flow_match_euler_grid(
        n, k, num_train_timesteps=t, device=device
    ),
    "dpm_flow": lambda n, k, t, device: dpm_flow_grid(n, k, num_train_timesteps=t, device=device),
    "uniform": lambda n, k, t, device: torch.linspace(
        1.0, 0.0, int(n) + 1, dtype=torch.float32, device=device
    ),
}
"""The sampling grids by name (``policy.diffusers.sample.sigma_grid``; docs/algorithms.md, "Conventions")."""


def grid(
    name: str,
    num_steps: int,
    shift: float,
    *,
    num_train_timesteps: int = 1000,
    device: torch.device | str | None = None,
) -> Tensor:
    """The ``[N + 1]`` grid ``name`` (a key of ``SIGMA_GRIDS``) for N steps at shift k."""
    if name not in SIGMA_GRIDS:
        raise ValueError(f"unknown sigma grid {name!r}: use one of {', '.join(SIGMA_GRIDS)}.")
    return SIGMA_GRIDS[name](num_steps, shift, num_train_timesteps, device)


def model_timestep(s: Tensor | float) -> Tensor | float:
    """Model-facing timestep ``1000 * s`` as a float (never truncated); a tensor comes back as float32."""
    if isinstance(s, Tensor):
        return s.to(torch.float32) * TIMESTEP_SCALE
    return float(s) * TIMESTEP_SCALE
