"""Samplers for rectified flow: pure step functions over ``(x, v, s, s')`` and one sampling loop.

Convention (docs/algorithms.md, "Conventions"): ``x_s = (1 - s) x0 + s eps``, sampling from ``s = 1`` (noise) down to
``s = 0``, velocity ``v ~ eps - x0``, clean estimate ``x0_hat = x - s v``. Every step function takes ``s`` and
``s'`` (``s' < s``) as Python floats or ``[B]`` tensors and does its arithmetic in float32; the new state comes
back in ``x.dtype``.

Solvers:

- ``euler``: ``x' = x + v (s' - s)``.
- ``dpm2``: DPM-Solver++(2M) (Lu et al. 2022, arXiv 2211.01095, Alg. 2 "midpoint" form) on the x0 prediction.
- ``flow_sde``: the Flow-GRPO reverse SDE step with Gaussian log-probabilities (arXiv 2505.05470, eq. 9-10).
- ``cps``: the coefficient-preserving variant of the stochastic step (docs/algorithms.md, "CPS step").

Log-probabilities are means over every non-batch dimension (C, H, W and T for video), shape ``[B]``: for
``flow_sde`` the exact Gaussian log-density with all constants, divided by the number of elements; for ``cps``
Flow-GRPO's ``-(x' - mean)^2`` score. Where the transition std is 0 (eta = 0, or CPS landing on s' = 0) the step
is deterministic and its log-prob is 0.

This module imports nothing else of sanarl.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sanarl.core.flow import SigmaLike, broadcast_sigma

GeneratorLike = torch.Generator | Sequence[torch.Generator] | None
"""One generator for the whole batch, one per sample (``len == B``), or None (torch's global RNG)."""

SOLVERS = ("euler", "dpm2", "flow_sde", "cps")
STOCHASTIC_SOLVERS = ("flow_sde", "cps")
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _sig(s: SigmaLike, x: Tensor) -> Tensor:
    """``s`` as float32 ``[B or 1, 1, ..., 1]`` on ``x.device``."""
    return broadcast_sigma(s, x, dtype=torch.float32)


def _per_sample(t: Tensor, batch: int) -> Tensor:
    """``[B or 1, 1, ...]`` -> ``[B]``."""
    return t.reshape(t.shape[0]).expand(batch).clone()


def _mean_nonbatch(t: Tensor) -> Tensor:
    return t.mean(dim=tuple(range(1, t.ndim))) if t.ndim > 1 else t


def draw_noise(like: Tensor, generator: GeneratorLike = None) -> Tensor:
    """Standard normal noise shaped like ``like`` (``[B, ...]``), float32 on ``like.device``.

    With a list of B generators, sample i is drawn from generator i alone (on that generator's device, then
    moved), so a sample's noise does not depend on the batch it is in. One generator draws the whole batch.
    """
    if generator is None:
        return torch.randn(like.shape, device=like.device, dtype=torch.float32)
    if isinstance(generator, torch.Generator):
        out = torch.randn(like.shape, generator=generator, device=generator.device, dtype=torch.float32)
        return out.to(like.device)
    if len(generator) != like.shape[0]:
        raise ValueError(
            f"got {len(generator)} generators for a batch of {like.shape[0]}: pass exactly one generator per "
            "sample (see initial_noise)."
        )
    rows = [torch.randn(like.shape[1:], generator=g, device=g.device, dtype=torch.float32) for g in generator]
    return torch.stack([r.to(like.device) for r in rows])


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Mean over non-batch dims of ``log N(x; mean, std^2)``, keeping all constants.

    Args:
        x, mean: ``[B, ...]``.
        std: ``[B]`` (or broadcastable ``[B, 1, ...]``) standard deviations; where ``std == 0`` the result is 0.

    Returns:
        ``[B]`` float32: ``mean_elems[-(x - mean)^2 / (2 std^2) - log std - log sqrt(2 pi)]``.
    """
    x, mean = x.to(torch.float32), mean.to(torch.float32)
    std_b = broadcast_sigma(std.reshape(-1), x, dtype=torch.float32)
    live = std_b > 0
    safe = torch.where(live, std_b, torch.ones_like(std_b))
    elem = -((x - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _HALF_LOG_2PI
    logp = _mean_nonbatch(elem)
    return torch.where(live.reshape(-1).expand_as(logp), logp, torch.zeros_like(logp))


def _check_step(s: Tensor, s_next: Tensor) -> None:
    if bool(((s_next >= s) | (s <= 0) | (s > 1) | (s_next < 0)).any()):
        raise ValueError(
            f"a sampler step needs 1 >= s > s' >= 0 (got s={s.flatten().tolist()}, "
            f"s'={s_next.flatten().tolist()}): pass a strictly decreasing sigma grid from at most 1 to 0."
        )


# ----------------------------------------------------------------------------------------------------------------
# deterministic steps


def euler_step(x: Tensor, v: Tensor, s: SigmaLike, s_next: SigmaLike) -> Tensor:
    """Euler step of the flow ODE ``dx/ds = v``: ``x' = x + v (s' - s)``.

    Args:
        x, v: ``[B, ...]`` state at level ``s`` and velocity there.
        s, s_next: float or ``[B]``, ``s' < s``.

    Returns:
        ``[B, ...]`` in ``x.dtype``. With the oracle velocity ``v = (x - x0) / s`` it lands on ``x0`` at s' = 0.
    """
    xf = x.to(torch.float32)
    return (xf + v.to(torch.float32) * (_sig(s_next, x) - _sig(s, x))).to(x.dtype)


@dataclass(frozen=True)
class Dpm2State:
    """Memory of DPM-Solver++(2M): the previous step's x0 prediction ``[B, ...]`` (float32) and its level."""

    x0: Tensor
    s: Tensor


def _log_snr(s: Tensor) -> Tensor:
    """``lambda(s) = log(alpha / sigma) = log((1 - s) / s)``; -inf at s = 1, +inf at s = 0."""
    return torch.log1p(-s) - torch.log(s)


def dpm2_step(
    x: Tensor, v: Tensor, s: SigmaLike, s_next: SigmaLike, prev: Dpm2State | None = None
) -> tuple[Tensor, Dpm2State]:
    """DPM-Solver++(2M) step on the x0 prediction, for rectified flow (``alpha = 1 - s``, ``sigma = s``).

    With ``D0 = x0_hat = x - s v``, ``lambda = log(alpha / sigma)``, ``h = lambda(s') - lambda(s)``:
    ``x' = (s' / s) x + (1 - s') (1 - e^-h) (D0 + 0.5 (h / h_prev) (D0 - D0_prev))``, where
    ``h_prev = lambda(s) - lambda(s_prev)``. The correction term is dropped (first order, which for rectified flow
    is exactly the Euler step) on the first step (``prev is None``), where the previous level was s = 1
    (``h_prev`` infinite) and on the final step to s' = 0; this is what diffusers'
    ``DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2, solver_type="midpoint",
    final_sigmas_type="zero")`` does (its ``lower_order_final`` makes the last step first order).

    Args:
        x, v: ``[B, ...]``; s, s_next: float or ``[B]``; prev: the state returned by the previous step.

    Returns:
        ``(x' [B, ...] in x.dtype, state for the next step)``. The oracle velocity returns x0 exactly.
    """
    xf = x.to(torch.float32)
    s_b, sn_b = _sig(s, x), _sig(s_next, x)
    _check_step(s_b, sn_b)
    x0 = xf - s_b * v.to(torch.float32)
    exp_neg_h = (sn_b * (1 - s_b)) / ((1 - sn_b) * s_b)
    d = x0
    if prev is not None:
        sp_b = _sig(prev.s, x)
        h = _log_snr(sn_b) - _log_snr(s_b)
        h_prev = _log_snr(s_b) - _log_snr(sp_b)
        first_order = (sn_b == 0) | (sp_b >= 1)
        ratio = torch.where(first_order, torch.zeros_like(h), h / h_prev)
        d = x0 + 0.5 * ratio * (x0 - prev.x0.to(torch.float32))
    x_next = (sn_b / s_b) * xf + (1 - sn_b) * (1 - exp_neg_h) * d
    return x_next.to(x.dtype), Dpm2State(x0=x0, s=_per_sample(s_b, x.shape[0]))


# ----------------------------------------------------------------------------------------------------------------
# stochastic steps


def _draw_next(
    x: Tensor, mean: Tensor, trans_std: Tensor, noise: Tensor | None, generator: GeneratorLike
) -> Tensor:
    """Draw ``x' ~ N(mean, trans_std^2)`` in ``x.dtype``; ``trans_std`` is ``[B, 1, ...]``."""
    eps = draw_noise(mean, generator) if noise is None else noise.to(mean.device, torch.float32)
    return (mean + trans_std * eps).to(x.dtype)


def flow_sde_step(
    x: Tensor,
    v: Tensor,
    s: SigmaLike,
    s_next: SigmaLike,
    *,
    eta: float,
    s_first_next: float,
    noise: Tensor | None = None,
    generator: GeneratorLike = None,
    x_next: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Flow-GRPO reverse-SDE step (arXiv 2505.05470 eq. 9; docs/algorithms.md, "Flow-GRPO SDE step"),
    ``dt = s' - s < 0``::

        std  = eta * sqrt(s / (1 - (s if s < 1 else s_first_next)))
        mean = x (1 + std^2 dt / (2 s)) + v (1 + std^2 (1 - s) / (2 s)) dt
        x'   = mean + std sqrt(-dt) eps,   eps ~ N(0, I)

    eta = 0 is exactly the Euler step.

    Args:
        x, v: ``[B, ...]``; s, s_next: float or ``[B]``.
        eta: noise level (>= 0). s_first_next: the grid's second value, used in place of s where s = 1.
        noise: explicit ``eps`` ``[B, ...]``; else drawn from ``generator`` (see ``draw_noise``).
        x_next: if given, nothing is drawn: the log-prob of this ``x'`` is evaluated (training re-evaluation,
            differentiable through ``v``; ``x'`` itself is detached).

    Returns:
        ``(x' [B, ...] in x.dtype, log_prob [B] float32, mean [B, ...] float32, std [B] float32)`` where ``std`` is
        the ``std`` above (without ``sqrt(-dt)``, the scale of Flow-GRPO's KL term); the transition std is
        ``std * sqrt(s - s')``. The log-prob is evaluated at ``x'`` as stored (after the cast to ``x.dtype``).
    """
    if eta < 0:
        raise ValueError(f"eta (noise_level) must be >= 0, got {eta}; use 0 for the deterministic ODE.")
    if not 0 <= s_first_next < 1:
        raise ValueError(f"s_first_next must be in [0, 1) (the grid's second sigma), got {s_first_next}.")
    xf, vf = x.to(torch.float32), v.to(torch.float32)
    s_b, sn_b = _sig(s, x), _sig(s_next, x)
    _check_step(s_b, sn_b)
    dt = sn_b - s_b
    denom = 1 - torch.where(s_b >= 1, torch.full_like(s_b, s_first_next), s_b)
    std = eta * torch.sqrt(s_b / denom)
    mean = xf * (1 + std**2 / (2 * s_b) * dt) + vf * (1 + std**2 * (1 - s_b) / (2 * s_b)) * dt
    trans_std = std * torch.sqrt(-dt)
    if x_next is None:
        x_next = _draw_next(x, mean, trans_std, noise, generator)
    logp = gaussian_log_prob(x_next.detach(), mean, _per_sample(trans_std, x.shape[0]))
    return x_next, logp, mean, _per_sample(std, x.shape[0])


def cps_step(
    x: Tensor,
    v: Tensor,
    s: SigmaLike,
    s_next: SigmaLike,
    *,
    eta: float,
    s_first_next: float | None = None,
    noise: Tensor | None = None,
    generator: GeneratorLike = None,
    x_next: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Coefficient-preserving stochastic step (docs/algorithms.md, "CPS step")::

        std    = s' sin(eta pi / 2)
        x0_hat = x - s v ;  x1_hat = x + (1 - s) v
        mean   = (1 - s') x0_hat + sqrt(s'^2 - std^2) x1_hat
        x'     = mean + std eps

    The coefficients of x0 and noise in ``x'`` are ``(1 - s', s')`` as on the forward path, so with the oracle
    velocity the marginal of ``x_{s'}`` is preserved. eta = 0 is the deterministic DDIM-like step.

    Same arguments and outputs as ``flow_sde_step`` (``s_first_next`` is accepted and unused). Here ``std`` is the
    transition std itself. The log-prob is Flow-GRPO's CPS score ``-mean_elems (x' - mean)^2``: the Gaussian
    log-density without its constants and without the ``1 / (2 std^2)`` factor, the scale the published CPS
    ``clip_range`` (1e-5) is set on (docs/algorithms.md, "CPS step"). Landing on s' = 0 the step is deterministic
    (``x' = mean``): log-prob 0.
    """
    del s_first_next
    if eta < 0:
        raise ValueError(f"eta (noise_level) must be >= 0, got {eta}; use 0 for the deterministic step.")
    xf, vf = x.to(torch.float32), v.to(torch.float32)
    s_b, sn_b = _sig(s, x), _sig(s_next, x)
    _check_step(s_b, sn_b)
    std = sn_b * math.sin(eta * math.pi / 2)
    x0_hat = xf - s_b * vf
    x1_hat = xf + (1 - s_b) * vf
    mean = (1 - sn_b) * x0_hat + torch.sqrt((sn_b**2 - std**2).clamp(min=0)) * x1_hat
    if x_next is None:
        x_next = _draw_next(x, mean, std, noise, generator)
    logp = -_mean_nonbatch((x_next.detach().to(torch.float32) - mean) ** 2)
    return x_next, logp, mean, _per_sample(std, x.shape[0])


def cfg_velocity(v_uncond: Tensor, v_cond: Tensor, w: SigmaLike) -> Tensor:
    """Classifier-free guidance (Ho & Salimans 2022): ``v = v_u + w (v_c - v_u)``; ``[B, ...]``, w float or [B].

    A float w multiplies as a Python scalar (as the diffusers pipelines do): a bf16 velocity is not scaled by w
    rounded to bf16."""
    if isinstance(w, (int, float)):
        return v_uncond + w * (v_cond - v_uncond)
    return v_uncond + broadcast_sigma(w, v_cond) * (v_cond - v_uncond)


# ----------------------------------------------------------------------------------------------------------------
# the loop


def initial_noise(
    shape_per_sample: Sequence[int],
    seeds: Sequence[int],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, list[torch.Generator]]:
    """Start noise ``[B, *shape_per_sample]`` and one generator per sample, from explicit seeds.

    Sample i is drawn in float32 from a fresh CPU ``torch.Generator`` seeded with ``seeds[i]``, then moved to
    ``device`` and cast to ``dtype``; the same seed gives the same noise on any device and in any batch. The
    returned generators have advanced past the start noise; pass them to ``sample_loop`` so the stochastic
    steps draw each sample's noise from its own generator and a seed fully determines the sample.
    """
    if len(seeds) == 0:
        raise ValueError("initial_noise needs at least one seed (one per sample).")
    generators = [torch.Generator(device="cpu").manual_seed(int(seed)) for seed in seeds]
    rows = [torch.randn(tuple(shape_per_sample), generator=g, dtype=torch.float32) for g in generators]
    return torch.stack(rows).to(device=device, dtype=dtype), generators


@dataclass
class SampleOutput:
    """What ``sample_loop`` returns.

    latents: ``[B, ...]`` final state (at ``sigmas[-1] = 0``).
    trajectory: ``N + 1`` tensors ``[B, ...]`` (``x_init`` first) if asked for, else None.
    log_probs: ``[B, len(timesteps_used)]`` float32 log-probs of the stochastic steps, None for ODE solvers.
    sigmas: the ``[N + 1]`` grid used.
    timesteps_used: indices i of the steps ``sigmas[i] -> sigmas[i + 1]`` that used the stochastic solver.
    means: ``[B, len(timesteps_used), ...]`` float32 step means of the stochastic steps if asked for (GRPO-Guard's
        old means), else None.
    """

    latents: Tensor
    trajectory: list[Tensor] | None
    log_probs: Tensor | None
    sigmas: Tensor
    timesteps_used: list[int]
    means: Tensor | None = None


def _check_grid(sigmas: Tensor) -> list[float]:
    vals = sigmas.detach().to("cpu", torch.float64).flatten().tolist()
    ok = sigmas.ndim == 1 and len(vals) >= 2 and vals[-1] == 0.0 and vals[0] <= 1.0
    if not ok or any(b >= a for a, b in zip(vals, vals[1:], strict=False)):
        raise ValueError(
            f"sigmas must be a 1-D strictly decreasing grid from at most 1 down to exactly 0 with >= 2 values "
            f"(got {vals}); build one with sanarl.core.flow.grid(name, num_steps, shift)."
        )
    return [float(v) for v in sigmas.detach().to("cpu", torch.float32).tolist()]


def _stochastic_steps(solver: str, num_steps: int, window: tuple[int, int] | None) -> list[int]:
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}: set sample.solver to one of {', '.join(SOLVERS)}.")
    if solver not in STOCHASTIC_SOLVERS:
        if window is not None:
            raise ValueError(
                f"window={window} only applies to the stochastic solvers {STOCHASTIC_SOLVERS}, not {solver!r}."
            )
        return []
    if window is None:
        return list(range(num_steps))
    a, b = window
    if not 0 <= a < b <= num_steps:
        raise ValueError(f"window {window} must satisfy 0 <= a < b <= num_steps = {num_steps}.")
    return list(range(a, b))


def sample_loop(
    velocity_fn: Callable[[Tensor, Tensor], Tensor],
    x_init: Tensor,
    sigmas: Tensor,
    *,
    solver: str = "euler",
    eta: float = 0.0,
    generators: Sequence[torch.Generator] | None = None,
    return_trajectory: bool = False,
    window: tuple[int, int] | None = None,
    callback: Callable[[int, float, Tensor], None] | None = None,
    return_means: bool = False,
) -> SampleOutput:
    """Integrate from ``x_init`` at ``sigmas[0]`` down to ``sigmas[N] = 0`` with one solver.

    Args:
        velocity_fn: ``(x [B, ...], s [B] float32) -> v [B, ...]``; the adapter turns s into its timestep.
        x_init: ``[B, ...]`` start noise (see ``initial_noise``).
        sigmas: ``[N + 1]`` strictly decreasing grid ending at 0 (see ``flow.grid``).
        solver: euler | dpm2 | flow_sde | cps.
        eta: noise level of the stochastic solvers.
        generators: B generators, sample i's step noise is drawn from ``generators[i]`` only.
        return_trajectory: keep all N + 1 states.
        window: ``(a, b)``: only steps a..b-1 are stochastic, the others Euler (Flow-GRPO-Fast); stochastic solvers
            only. Default: every step of a stochastic solver.
        callback: called as ``callback(i, s_next, x_next)`` after step i.
        return_means: keep the stochastic steps' means (``SampleOutput.means``).

    Returns:
        ``SampleOutput``. The loop does not touch autograd mode: wrap rollouts in ``torch.no_grad()``.
    """
    grid = _check_grid(sigmas)
    num_steps = len(grid) - 1
    stochastic = set(_stochastic_steps(solver, num_steps, window))
    batch = x_init.shape[0]
    x, state, log_probs, means = x_init, None, [], []
    trajectory = [x_init] if return_trajectory else None
    for i in range(num_steps):
        s, s_next = grid[i], grid[i + 1]
        v = velocity_fn(x, torch.full((batch,), s, dtype=torch.float32, device=x.device))
        if i in stochastic:
            step = flow_sde_step if solver == "flow_sde" else cps_step
            x, logp, mean, _ = step(x, v, s, s_next, eta=eta, s_first_next=grid[1], generator=generators)
            log_probs.append(logp)
            if return_means:
                means.append(mean)
        elif solver == "dpm2":
            x, state = dpm2_step(x, v, s, s_next, state)
        else:
            x = euler_step(x, v, s, s_next)
        if trajectory is not None:
            trajectory.append(x)
        if callback is not None:
            callback(i, s_next, x)
    return SampleOutput(
        latents=x,
        trajectory=trajectory,
        log_probs=torch.stack(log_probs, dim=1) if log_probs else None,
        sigmas=sigmas,
        timesteps_used=sorted(stochastic),
        means=torch.stack(means, dim=1) if means else None,
    )
