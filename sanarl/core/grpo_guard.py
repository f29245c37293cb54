"""GRPO-Guard (arXiv 2510.22319; docs/algorithms.md, "GRPO-Guard"): the normalised importance ratio of a Flow-GRPO
SDE step and the clipped loss on it.

For the Gaussian step ``x' ~ N(mu, sigma^2)`` (``sigma = std sqrt(s - s')``, the transition std) the plain log-ratio
``log p_theta(x') - log p_old(x')`` has a negative mean that grows as sigma shrinks, and its gradient scales as
``1 / sigma``. The Guard log-ratio ``sigma (logp_theta - logp_old) + mean (mu_theta - mu_old)^2 / (2 sigma)`` equals
``mean(z (mu_theta - mu_old))`` with ``x' = mu_old + sigma z``: zero-mean, and its gradient no longer grows at the
low-noise steps. This module imports nothing else of sanarl.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_vec(name: str, t: Tensor, batch: int) -> Tensor:
    if t.ndim == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.shape != (batch,):
        raise ValueError(f"GRPO-Guard needs {name} of shape [{batch}], got {tuple(t.shape)}.")
    return t


def guard_log_ratio(
    log_prob: Tensor, old_log_prob: Tensor, mean: Tensor, old_mean: Tensor, trans_std: Tensor
) -> Tensor:
    """``sigma (log_prob - old_log_prob) + mean_CHW (mean - old_mean)^2 / (2 sigma)`` ``[B]``.

    log_prob ``[B]`` (grad) and old_log_prob ``[B]``: the step's per-element-mean Gaussian log-densities at the
    stored ``x'``; mean ``[B, ...]`` (grad), old_mean ``[B, ...]``: the step means of the policy and of the rollout
    policy; trans_std ``[B]``: sigma, the transition std (``std sqrt(-dt)``), a constant.
    """
    batch = log_prob.shape[0]
    if log_prob.ndim != 1 or mean.shape != old_mean.shape or mean.shape[0] != batch:
        raise ValueError(
            f"guard_log_ratio needs log_prob [B] and two step means [B, ...] of one shape, got "
            f"{tuple(log_prob.shape)}, {tuple(mean.shape)}, {tuple(old_mean.shape)}."
        )
    old = _check_vec("old_log_prob", old_log_prob, batch).detach()
    sigma = _check_vec("trans_std", trans_std, batch).detach().to(log_prob.dtype)
    if not bool((sigma > 0).all()):
        raise ValueError("GRPO-Guard needs a stochastic step (transition std > 0); got a zero std.")
    mse = (mean - old_mean.detach()).flatten(1).square().mean(dim=1)
    return (log_prob - old) * sigma + mse / (2 * sigma)


def guard_clip_loss(
    log_ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """``L = mean max(-A r, -A clamp(r, 1 + clip_low, 1 + clip_high))`` with ``r = exp(log_ratio)`` (the Guard
    ratio), ``clip_low < 0 < clip_high``. Returns ``(L, metrics)``: ratio_mean, clip_frac_low, clip_frac_high."""
    batch = log_ratio.shape[0]
    if log_ratio.ndim != 1:
        raise ValueError(f"guard_clip_loss needs log_ratio of shape [B], got {tuple(log_ratio.shape)}.")
    if not clip_low < 0 < clip_high:
        raise ValueError(f"GRPO-Guard's clip range needs low < 0 < high, got ({clip_low}, {clip_high}).")
    adv = _check_vec("adv", adv, batch).detach()
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 + clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped).mean()
    r = ratio.detach()
    return loss, {
        "ratio_mean": r.mean(),
        "clip_frac_low": (r < 1.0 + clip_low).float().mean(),
        "clip_frac_high": (r > 1.0 + clip_high).float().mean(),
    }
