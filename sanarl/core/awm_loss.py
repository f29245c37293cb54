"""Advantage Weighted Matching (AWM, arXiv 2509.25050; docs/algorithms.md, "AWM"): the flow-matching error on the
policy's own samples as a log-likelihood surrogate, its weightings, the trained grid steps, the PPO-style ratio
on that surrogate and the velocity KL terms.

Convention: ``x_s = (1 - s) x0 + s eps``, ``v* = eps - x0``; ``x0`` is the final latent of a rollout (any ODE
sampler), ``eps`` fresh training noise, ``s`` a level of the rollout's grid. This module imports nothing else of
sanarl.
"""

from __future__ import annotations

import torch
from torch import Tensor

AWM_WEIGHTINGS = ("uniform", "t", "t2", "huber", "ghuber")
AWM_STEP_SCHEMES = ("discrete", "discrete_with_init", "discrete_wo_init")
AWM_LOSS_TYPES = ("exp_first", "sum_first")
AWM_KL_WEIGHTS = ("uniform", "elbo")
_HUBER_EPS = 1e-10


def _per_sample(s: Tensor | float, batch: int, like: Tensor) -> Tensor:
    s_t = torch.as_tensor(s, dtype=like.dtype, device=like.device).reshape(-1)
    if s_t.numel() == 1:
        return s_t.expand(batch)
    if s_t.numel() != batch:
        raise ValueError(f"needs s as a scalar or one level per sample ({batch}), got {s_t.numel()} values.")
    return s_t


def awm_log_prob(
    v: Tensor,
    x0: Tensor,
    eps: Tensor,
    s: Tensor | float,
    *,
    weighting: str = "uniform",
    ghuber_power: float = 0.25,
) -> Tensor:
    """AWM's per-sample log-likelihood surrogate ``[B]`` (float64, differentiable through ``v``).

    ``e = mean_CHW (v - (eps - x0))^2`` (in float64), then by ``weighting``:
    uniform ``-e``; t ``-s e``; t2 ``-s^2 e``; huber ``-(sqrt(e + 1e-10) - 1e-5) s``;
    ghuber ``-((e + 1e-10)^p - (1e-10)^p) s / p`` with ``p = ghuber_power``.

    Args:
        v: the model's velocity at ``x_s`` ``[B, ...]``; x0, eps: ``[B, ...]`` (constants); s: scalar or ``[B]``.
    """
    if weighting not in AWM_WEIGHTINGS:
        raise ValueError(f"unknown AWM weighting {weighting!r}: use one of {', '.join(AWM_WEIGHTINGS)}.")
    if v.shape != x0.shape or v.shape != eps.shape or v.ndim < 2:
        raise ValueError(
            f"awm_log_prob needs v, x0, eps of one shape [B, ...], got {tuple(v.shape)}, {tuple(x0.shape)}, "
            f"{tuple(eps.shape)}."
        )
    if weighting == "ghuber" and not ghuber_power > 0:
        raise ValueError(f"ghuber_power must be > 0, got {ghuber_power}.")
    target = eps.detach().double() - x0.detach().double()
    err = (v.double() - target).square().flatten(1).mean(dim=1)
    s_b = _per_sample(s, v.shape[0], err)
    if weighting == "uniform":
        return -err
    if weighting == "t":
        return -err * s_b
    if weighting == "t2":
        return -err * s_b**2
    if weighting == "huber":
        return -(torch.sqrt(err + _HUBER_EPS) - 1e-5) * s_b
    floor = torch.tensor(_HUBER_EPS, dtype=err.dtype, device=err.device) ** ghuber_power
    return -((err + _HUBER_EPS) ** ghuber_power - floor) * s_b / ghuber_power


def awm_train_step_indices(
    num_train: int,
    num_steps: int,
    fraction: float,
    *,
    scheme: str = "discrete_wo_init",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Grid step indices ``[num_train]`` (long) that AWM trains, one stratified draw shared by a batch.

    With ``m = int(num_steps fraction)``: ``discrete`` splits ``[0, m]`` into ``num_train`` equal strata
    (``linspace`` boundaries truncated to integers) and draws ``lo + int(u (hi - lo))`` in each; ``discrete_wo_init``
    the same over ``[1, m]`` (never the pure-noise step 0: the published recipe); ``discrete_with_init`` takes step 0
    plus ``num_train - 1`` strata of ``[1, m]``. ``u`` are ``torch.rand`` draws from ``generator``.
    """
    if scheme not in AWM_STEP_SCHEMES:
        raise ValueError(f"unknown AWM step scheme {scheme!r}: use one of {', '.join(AWM_STEP_SCHEMES)}.")
    if num_train < 1 or num_steps < 1 or not 0 < fraction <= 1:
        raise ValueError(
            f"AWM step sampling needs num_train >= 1, num_steps >= 1 and 0 < fraction <= 1, got {num_train}, "
            f"{num_steps}, {fraction}."
        )
    top = int(num_steps * fraction)
    if scheme == "discrete":
        return _strata(0, top, num_train, generator)
    if scheme == "discrete_wo_init":
        return _strata(1, top, num_train, generator)
    head = torch.zeros(1, dtype=torch.long)
    if num_train == 1:
        return head
    return torch.cat([head, _strata(1, top, num_train - 1, generator)])


def _strata(low: int, high: int, count: int, generator: torch.Generator | None) -> Tensor:
    bounds = torch.linspace(low, high, steps=count + 1)
    lo, hi = bounds[:-1].long(), bounds[1:].long()
    u = torch.rand(count, generator=generator)
    return lo + (u * (hi - lo)).long()


def awm_advantages(adv: Tensor, adv_clip_max: float, advantage_max: float | None) -> Tensor:
    """``clamp(A, -c, c)``, then ``A / c * advantage_max`` when ``advantage_max`` is set (``c = adv_clip_max``)."""
    if not adv_clip_max > 0:
        raise ValueError(f"adv_clip_max must be > 0, got {adv_clip_max}.")
    out = adv.clamp(-adv_clip_max, adv_clip_max)
    if advantage_max is not None:
        out = out / adv_clip_max * advantage_max
    return out


def awm_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    adv: Tensor,
    *,
    clip_range: float,
    loss_type: str = "exp_first",
) -> tuple[Tensor, dict[str, Tensor]]:
    """AWM's PPO-style loss on the surrogate: log_prob, old_log_prob ``[T, B]`` (T trained levels per sample),
    adv ``[B]`` (already through ``awm_advantages``).

    exp_first: ``ratio = exp(lp - old)`` per ``(t, b)``, A repeated over t; sum_first: ``ratio = exp(mean_t lp -
    mean_t old)`` per sample. ``L = mean max(-A ratio, -A clamp(ratio, 1 - c, 1 + c))``. On-policy (old = lp
    detached) the ratio is 1 and ``dL = -mean A d lp``: the advantage-weighted flow-matching gradient.
    Returns ``(L, metrics)``: ratio_mean and clip_frac (detached).
    """
    if loss_type not in AWM_LOSS_TYPES:
        raise ValueError(f"unknown AWM loss_type {loss_type!r}: use one of {', '.join(AWM_LOSS_TYPES)}.")
    if log_prob.ndim != 2 or old_log_prob.shape != log_prob.shape or adv.shape != log_prob.shape[1:]:
        raise ValueError(
            f"awm_policy_loss needs log_prob and old_log_prob [T, B] and adv [B], got {tuple(log_prob.shape)}, "
            f"{tuple(old_log_prob.shape)}, {tuple(adv.shape)}."
        )
    adv = adv.detach()
    if loss_type == "sum_first":
        ratio = torch.exp(log_prob.mean(dim=0) - old_log_prob.mean(dim=0).detach())
    else:
        ratio = torch.exp(log_prob.reshape(-1) - old_log_prob.reshape(-1).detach())
        adv = adv.unsqueeze(0).repeat(log_prob.shape[0], 1).reshape(-1)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    r = ratio.detach()
    return loss, {"ratio_mean": r.mean(), "clip_frac": ((r - 1.0).abs() > clip_range).float().mean()}


def awm_velocity_kl(
    v: Tensor, v_ref: Tensor, s: Tensor | float, *, weight: str = "uniform", noise_level: float = 0.7
) -> Tensor:
    """AWM's KL surrogate, a 0-dim mean over the batch of ``mean_CHW (v - v_ref)^2`` (v_ref a constant: the base
    model for ``beta``, the EMA policy for ``ema_beta``); ``elbo`` divides each sample's term by ``2 std^2`` with
    ``std = noise_level sqrt(s / (1 - clamp(s, 0, 0.99)))``."""
    if weight not in AWM_KL_WEIGHTS:
        raise ValueError(f"unknown AWM kl weight {weight!r}: use one of {', '.join(AWM_KL_WEIGHTS)}.")
    if v.shape != v_ref.shape or v.ndim < 2:
        raise ValueError(
            f"awm_velocity_kl needs two [B, ...] tensors, got {tuple(v.shape)}, {tuple(v_ref.shape)}."
        )
    sq = (v - v_ref.detach()).square().flatten(1).mean(dim=1)
    if weight == "elbo":
        s_b = _per_sample(s, v.shape[0], sq)
        std = torch.sqrt(s_b / (1 - s_b.clamp(0, 0.99))) * noise_level
        sq = sq / (2 * std**2)
    return sq.mean()


def awm_kl_ema_decay(step: int, decay: float, kind: str = "linear") -> float:
    """Decay of the EMA copy that the ``ema_beta`` KL pulls towards, updated once per rollout epoch as
    ``ema = d ema + (1 - d) theta``: ``d = decay`` (constant) or ``d = min(decay, 0.001 step)`` (linear, the
    published choice with decay 0.3, so the first update copies the policy)."""
    if kind not in ("linear", "constant"):
        raise ValueError(f"unknown kl_ema_decay_type {kind!r}: use linear or constant.")
    if not 0 <= decay < 1 or step < 0:
        raise ValueError(f"kl_ema_decay must be in [0, 1) and step >= 0, got {decay} and {step}.")
    return decay if kind == "constant" else min(decay, 0.001 * step)
