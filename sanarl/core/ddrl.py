"""DDRL's math (arXiv 2512.04332; docs/algorithms.md, "DDRL"): the advantage transform, the trained-step selection
and the data-regularized loss, Flow-GRPO's policy and KL terms plus the flow-matching loss on data."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .advantages import clip_advantages
from .flow import velocity_target
from .grpo_loss import gaussian_mean_kl, ppo_clip_loss

RANDOM_STEP = -1
"""A `train_on` entry that stands for one step drawn at random from the steps not listed."""


def ddrl_advantages(adv: torch.Tensor, exp_reward: bool, low: float, high: float) -> torch.Tensor:
    """`clamp(lambda(A), low, high)` with `lambda(A) = -exp(-A)` when `exp_reward`, else the identity (Cosmos-RL
    transforms first, then clips); any shape."""
    return clip_advantages(-torch.exp(-adv) if exp_reward else adv, low, high)


def select_train_on(
    train_on: Sequence[int], candidates: Sequence[int], generator: torch.Generator
) -> list[int]:
    """The grid steps one rollout trains, ascending: the explicit entries of `train_on`, plus one step per
    `RANDOM_STEP` entry drawn uniformly without replacement from the `candidates` (the steps with a random
    transition) that are not listed. Raises ValueError when a listed step is no candidate or too few remain."""
    fixed = [int(i) for i in train_on if i != RANDOM_STEP]
    if len(set(fixed)) != len(fixed) or any(i not in candidates for i in fixed):
        raise ValueError(
            f"train_on = {list(train_on)} must list distinct steps among the random ones {list(candidates)}."
        )
    extra = len(train_on) - len(fixed)
    rest = [i for i in candidates if i not in fixed]
    if extra > len(rest):
        raise ValueError(
            f"train_on = {list(train_on)} asks for {extra} random steps but only {len(rest)} remain."
        )
    order = torch.randperm(len(rest), generator=generator)[:extra].tolist()
    return sorted(fixed + [rest[k] for k in order])


DATA_WEIGHTINGS = ("edm", "uniform")
"""Values of `ddrl.data_weighting` (`data_weight`)."""


def data_weight(s: torch.Tensor, weighting: str) -> torch.Tensor:
    """Per-sample weight [B] of the data term at levels `s` [B] (docs/algorithms.md, "DDRL").

    edm: `s^2 + (1 - s)^2`, Cosmos-RL's x0 loss `(sigma^2 + 1) / sigma^2 |x0 - x0_hat|^2` (EDM weighting,
    sigma_data 1, rectified-flow scaling, sigma = s / (1 - s)) written on the velocity; uniform: 1 (the plain
    flow-matching loss)."""
    if weighting == "edm":
        return s.square() + (1 - s).square()
    if weighting == "uniform":
        return torch.ones_like(s)
    raise ValueError(f"unknown data_weighting {weighting!r}; use one of {', '.join(DATA_WEIGHTINGS)}.")


def flow_matching_loss(
    v: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample flow-matching loss `w mean_CHW (v - (eps - x0))^2` of a velocity `v` [B, ...] predicted at
    `(1 - s) x0 + s eps`, with per-sample weights `weight` [B] (None: 1); returns [B]."""
    if not (v.shape == x0.shape == eps.shape) or v.ndim < 2:
        raise ValueError(
            f"flow_matching_loss needs v, x0 and eps of one [B, ...] shape, got {tuple(v.shape)}, "
            f"{tuple(x0.shape)} and {tuple(eps.shape)}."
        )
    loss = (v - velocity_target(x0, eps)).square().flatten(1).mean(dim=1)
    return loss if weight is None else loss * weight.to(loss.dtype)


def ddrl_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    adv: torch.Tensor,
    clip_range: float,
    *,
    kl_beta: float = 0.0,
    mean: torch.Tensor | None = None,
    mean_ref: torch.Tensor | None = None,
    std: torch.Tensor | float | None = None,
    data_beta: float = 0.0,
    v_data: torch.Tensor | None = None,
    x0: torch.Tensor | None = None,
    eps: torch.Tensor | None = None,
    data_weight: torch.Tensor | None = None,
    loss_scale: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`loss_scale (L_pg + kl_beta L_kl + data_beta L_data)` of one micro-batch (docs/algorithms.md, "DDRL", step 5).

    L_pg: Flow-GRPO's PPO-clip on `log_prob` [B] against `old_log_prob` [B] with the (already transformed and
    clipped) advantages `adv` [B]; L_kl (when kl_beta > 0): `mean_B gaussian_mean_kl(mean, mean_ref, std)`;
    L_data (when data_beta > 0 and `v_data` is given): `mean_B flow_matching_loss(v_data, x0, eps, data_weight)`.
    `loss_scale` multiplies the sum (Cosmos-RL's `loss_scale`, 10: it matters under gradient-norm clipping). Returns
    the loss and detached metrics (the PPO ones, `policy_loss`, `kl`, `data_loss`, each unscaled)."""
    policy, metrics = ppo_clip_loss(log_prob, old_log_prob, adv, clip_range)
    zero = policy.new_zeros(())
    kl = gaussian_mean_kl(mean, mean_ref, std).mean() if kl_beta > 0 else zero
    use_data = data_beta > 0 and v_data is not None
    data = flow_matching_loss(v_data, x0, eps, data_weight).mean() if use_data else zero
    loss = loss_scale * (policy + kl_beta * kl + data_beta * data)
    metrics.update(policy_loss=policy.detach(), kl=kl.detach(), data_loss=data.detach())
    return loss, metrics
