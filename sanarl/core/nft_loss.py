"""DiffusionNFT training loss (arXiv 2509.16117; docs/algorithms.md, "DiffusionNFT", step 3).

The old-policy weight decay (step 4) lives elsewhere; this module is only the per-batch objective.
"""

from __future__ import annotations

import torch

from .advantages import nft_adv_transform

NORM_FLOOR = 1e-5
"""Lower bound of the per-sample normaliser `max(mean_CHW |x0_hat - x0|, 1e-5)`."""


def _per_sample_adv(adv: torch.Tensor, batch: int) -> torch.Tensor:
    """`[B]` or `[B, 1]` advantages -> `[B]` (never broadcast a `[B, 1]` weight against a `[B]` loss)."""
    if adv.ndim == 2 and adv.shape[1] == 1:
        adv = adv[:, 0]
    if adv.shape != (batch,):
        raise ValueError(
            f"nft_loss needs one advantage per sample: shape [{batch}] (or [{batch}, 1]), got {tuple(adv.shape)}."
        )
    return adv


def _check_shapes(v_theta: torch.Tensor, others: dict[str, torch.Tensor | None], t: torch.Tensor) -> None:
    if v_theta.ndim < 2:
        raise ValueError(f"nft_loss needs [B, C, ...] tensors, got v_theta of shape {tuple(v_theta.shape)}.")
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != v_theta.shape:
            raise ValueError(
                f"nft_loss: {name} has shape {tuple(tensor.shape)} but v_theta has {tuple(v_theta.shape)}."
            )
    if t.shape != (v_theta.shape[0],):
        raise ValueError(
            f"nft_loss needs t of shape [{v_theta.shape[0]}] (one sigma per sample), got {tuple(t.shape)}."
        )


def _per_sample_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over every dim but the first: `[B, ...] -> [B]`."""
    return x.flatten(1).mean(dim=1)


def normalised_x0_loss(x0_hat: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """Per-sample `mean((x0_hat - x0)^2) / stopgrad(max(mean|x0_hat - x0|, 1e-5))`: `[B, ...] -> [B]`."""
    err = x0_hat - x0
    scale = _per_sample_mean(err.detach().abs()).clamp_min(NORM_FLOOR)
    return _per_sample_mean(err.square()) / scale


def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    adv: torch.Tensor,
    *,
    beta: float,
    adv_clip_max: float,
    v_ref: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    adv_mode: str = "all",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DiffusionNFT loss on one micro-batch.

    Shapes: v_theta, v_old, x_t, x0 (and v_ref) `[B, C, H, W]` or `[B, C, T, H, W]`; t `[B]` (sigma of x_t,
    `x_t = (1 - t) x0 + t eps`); adv `[B]` or `[B, 1]`; beta > 0 and C = adv_clip_max > 0 (the ranges of `nft_beta`
    and `advantage_high`, checked at config load):
        A_c = nft_adv_transform(adv, adv_mode, C);  r = clamp(A_c / (2C) + 0.5, 0, 1)           [B]
        v_pos = beta v_theta + (1 - beta) v_old;  v_neg = (1 + beta) v_old - beta v_theta
        L_pos = normalised_x0_loss(x_t - t v_pos, x0);  L_neg likewise with v_neg                 [B]
        policy = mean_B(r L_pos + (1 - r) L_neg) * C / beta;  kl = mean_B mean (v_theta - v_ref)^2
        loss = policy + kl_beta kl
    v_old and v_ref are treated as constants. Computation runs in at least float32. Returns `(loss, metrics)`;
    metrics are detached 0-dim tensors: policy_loss, kl_div_loss, old_deviation (mean (v_theta - v_old)^2), r_mean.
    """
    if kl_beta > 0 and v_ref is None:
        raise ValueError(
            f"kl_beta={kl_beta} > 0 needs v_ref (the base model's velocity); pass it or set kl_beta 0."
        )
    _check_shapes(v_theta, {"v_old": v_old, "x_t": x_t, "x0": x0, "v_ref": v_ref}, t)
    batch = v_theta.shape[0]
    dtype = torch.promote_types(v_theta.dtype, torch.float32)
    v_th = v_theta.to(dtype)
    v_o = v_old.detach().to(dtype)
    x_t, x0 = x_t.to(dtype), x0.to(dtype)
    a_c = nft_adv_transform(_per_sample_adv(adv, batch).to(dtype), adv_mode, adv_clip_max)
    r = (a_c / (2 * adv_clip_max) + 0.5).clamp(0.0, 1.0)
    t_b = t.to(dtype).reshape(batch, *([1] * (v_th.ndim - 1)))
    l_pos = normalised_x0_loss(x_t - t_b * (beta * v_th + (1 - beta) * v_o), x0)
    l_neg = normalised_x0_loss(x_t - t_b * ((1 + beta) * v_o - beta * v_th), x0)
    assert l_pos.shape == l_neg.shape == r.shape == (batch,)
    policy_loss = (r * l_pos + (1 - r) * l_neg).mean() * (adv_clip_max / beta)
    if v_ref is not None:
        kl = _per_sample_mean((v_th - v_ref.detach().to(dtype)).square()).mean()
    else:
        kl = policy_loss.new_zeros(())
    loss = policy_loss + kl_beta * kl
    metrics = {
        "policy_loss": policy_loss.detach(),
        "kl_div_loss": kl.detach(),
        "old_deviation": (v_th.detach() - v_o).square().mean(),
        "r_mean": r.mean().detach(),
    }
    return loss, metrics
