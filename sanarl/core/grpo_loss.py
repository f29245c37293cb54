"""Flow-GRPO loss terms (arXiv 2505.05470; docs/algorithms.md, "Flow-GRPO"): PPO-clip, the mean-matching KL, and the
dropping of groups without signal."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .advantages import group_indices


def _as_batch(x: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.shape != (batch,):
        raise ValueError(
            f"ppo_clip_loss needs {name} of shape [{batch}] (one value per sample), got {tuple(x.shape)}."
        )
    return x


def ppo_clip_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, adv: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) as used by Flow-GRPO.

    log_prob `[B]` (grad), old_log_prob `[B]` (constant), adv `[B]` (or `[B, 1]`), clip_range eps > 0 (its
    range, checked at config load):
        ratio = exp(log_prob - old_log_prob)
        L = mean_B max(-A ratio, -A clamp(ratio, 1 - eps, 1 + eps))
    Returns `(L, metrics)` with detached 0-dim metrics: ratio_mean, ratio_min, ratio_max, clip_frac (fraction with
    |ratio - 1| > eps) and approx_kl = 0.5 mean (log_prob - old_log_prob)^2.
    """
    if log_prob.ndim != 1:
        raise ValueError(f"ppo_clip_loss needs log_prob of shape [B], got {tuple(log_prob.shape)}.")
    batch = log_prob.shape[0]
    old = _as_batch(old_log_prob, "old_log_prob", batch).detach()
    adv = _as_batch(adv, "adv", batch).detach()
    log_ratio = log_prob - old
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    r = ratio.detach()
    metrics = {
        "ratio_mean": r.mean(),
        "ratio_min": r.min(),
        "ratio_max": r.max(),
        "clip_frac": ((r - 1.0).abs() > clip_range).float().mean(),
        "approx_kl": 0.5 * log_ratio.detach().square().mean(),
    }
    return loss, metrics


def gaussian_mean_kl(
    mean_theta: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor | float
) -> torch.Tensor:
    """Per-sample KL term of Flow-GRPO at the published scale: `mean_CHW (mu_theta - mu_ref)^2 / (2 std^2)`.

    mean_theta, mean_ref `[B, ...]` (the SDE step means, mean_ref a constant); std `[B]`, a 0-dim tensor or a
    float (the step's `std` before the `sqrt(-dt)` factor, as published). Returns `[B]`; the caller takes the
    batch mean and multiplies by kl_beta.
    """
    if mean_theta.shape != mean_ref.shape or mean_theta.ndim < 2:
        raise ValueError(
            f"gaussian_mean_kl needs two [B, ...] means of equal shape, got {tuple(mean_theta.shape)} and "
            f"{tuple(mean_ref.shape)}."
        )
    batch = mean_theta.shape[0]
    std_t = torch.as_tensor(std, dtype=mean_theta.dtype, device=mean_theta.device)
    if std_t.ndim == 2 and std_t.shape[1] == 1:
        std_t = std_t[:, 0]
    if std_t.shape not in ((), (batch,)):
        raise ValueError(
            f"gaussian_mean_kl needs std as a scalar or of shape [{batch}], got {tuple(std_t.shape)}."
        )
    if not bool((std_t > 0).all()):
        raise ValueError(
            "gaussian_mean_kl needs std > 0 (an SDE step with eta > 0), got a zero or negative std."
        )
    sq = (mean_theta - mean_ref.detach()).square().flatten(1).mean(dim=1)
    return sq / (2 * std_t.square())


def drop_zero_std_groups(prompts: Sequence[str], rewards: torch.Tensor) -> torch.Tensor:
    """Keep mask `[N]` (bool): false for every sample of a prompt group whose rewards are all exactly equal
    (such a group has zero advantages and carries no signal); groups by the raw prompt string."""
    if rewards.ndim != 1 or len(prompts) != rewards.shape[0]:
        raise ValueError(
            f"drop_zero_std_groups needs one prompt per reward and rewards of shape [N]: got {len(prompts)} "
            f"prompts and rewards of shape {tuple(rewards.shape)}."
        )
    keep = torch.ones(rewards.shape[0], dtype=torch.bool)
    r = rewards.detach().cpu()
    for idx in group_indices(prompts).values():
        g = r[idx]
        if bool((g == g[0]).all()):
            keep[idx] = False
    return keep
