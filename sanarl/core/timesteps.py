"""Training timestep densities and loss weights (docs/algorithms.md, "SFT"; SD3, Esser et al. 2024, sec. 3.1).

``sample_u`` draws ``u`` in (0, 1) from a density, ``u_to_sigma`` maps it onto the model's (shifted) grid, and
``loss_weight`` gives the per-sample weight ``w(s)`` of the flow-matching loss. Schemes:

=============  ===================================================  ============================
scheme         u                                                    w(s)
=============  ===================================================  ============================
logit_normal   ``sigmoid(N(logit_mean, logit_std))``                1
mode           ``1 - t - m (cos^2(pi t / 2) - 1 + t)``, t ~ U(0,1)  1
uniform        ``U(0, 1)``                                          1
sigma_sqrt     ``U(0, 1)``                                          ``s^-2`` (s clamped >= min_sigma)
cosmap         ``U(0, 1)``                                          ``2 / (pi (1 - 2 s + 2 s^2))``
=============  ===================================================  ============================

These are the formulas of diffusers' ``compute_density_for_timestep_sampling`` and
``compute_loss_weighting_for_sd3``. This module imports nothing else of sanarl.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sanarl.core.flow import shift_sigmas

SCHEMES = ("logit_normal", "mode", "uniform", "sigma_sqrt", "cosmap")
"""Every accepted ``weighting_scheme``."""


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(
            f"unknown timestep weighting scheme {scheme!r}: set policy.diffusers.weighting_scheme to one of "
            f"{', '.join(SCHEMES)}."
        )


def mode_warp(t: Tensor, mode_scale: float = 1.29) -> Tensor:
    """The "mode" density's warp of a uniform ``t``: ``u = 1 - t - m (cos^2(pi t / 2) - 1 + t)``.

    Monotone from (t=0, u=1) to (t=1, u=0) for ``m < 1 / (pi/2 - 1) ~ 1.75``, so ``u`` stays in (0, 1) for
    ``t`` in (0, 1); ``m = 0`` is the uniform density. Elementwise, any shape.
    """
    return 1 - t - mode_scale * (torch.cos(math.pi * t / 2) ** 2 - 1 + t)


def sample_u(
    scheme: str,
    batch: int,
    *,
    generator: torch.Generator | None,
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    mode_scale: float = 1.29,
    device: torch.device | str | None = None,
) -> Tensor:
    """Draw ``batch`` training timesteps ``u`` in (0, 1) from the named density.

    Args:
        scheme: one of ``SCHEMES``; sigma_sqrt and cosmap draw uniformly (their shape lives in ``loss_weight``).
        batch: B, the number of draws.
        generator: the random source (drawn on the generator's device, then moved); None = torch's global RNG.
        logit_mean, logit_std: parameters of the logit-normal density.
        mode_scale: m of the mode density.
        device: where the result goes.

    Returns:
        ``[B]`` float32 tensor.
    """
    _check_scheme(scheme)
    gen_device = generator.device if generator is not None else None
    if scheme == "logit_normal":
        z = torch.randn(batch, generator=generator, device=gen_device, dtype=torch.float32)
        u = torch.sigmoid(logit_mean + logit_std * z)
    else:
        u = torch.rand(batch, generator=generator, device=gen_device, dtype=torch.float32)
        if scheme == "mode":
            u = mode_warp(u, mode_scale)
    return u.to(device) if device is not None else u


def loss_weight(scheme: str, s: Tensor, *, min_sigma: float = 1e-3) -> Tensor:
    """Per-sample flow-matching loss weight ``w(s)``.

    Args:
        scheme: one of ``SCHEMES``.
        s: ``[B]`` noise levels the loss is evaluated at.
        min_sigma: sigma_sqrt clamps ``s`` to at least this before ``s^-2`` (the weight at s = 0 is infinite).

    Returns:
        ``[B]`` float32 weights: 1 (logit_normal, mode, uniform), ``s^-2`` (sigma_sqrt),
        ``2 / (pi (1 - 2 s + 2 s^2))`` (cosmap, the density of the cosine map of Esser et al.).
    """
    _check_scheme(scheme)
    s = s.to(torch.float32)
    if scheme == "sigma_sqrt":
        return s.clamp(min=min_sigma) ** -2
    if scheme == "cosmap":
        return 2.0 / (math.pi * (1 - 2 * s + 2 * s**2))
    return torch.ones_like(s)


def u_to_sigma(u: Tensor, shift: float) -> Tensor:
    """Map a draw ``u`` onto the model's grid: ``s = shift(u, k) = k u / (1 + (k - 1) u)``; ``k = 1`` = identity."""
    return shift_sigmas(u, shift)
