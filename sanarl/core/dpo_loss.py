"""Diffusion-DPO (arXiv 2311.12908; docs/algorithms.md, "Diffusion-DPO") for rectified flow: the per-sample
velocity errors, the preference loss against a frozen reference, and the online pairing of each rollout group's
best and worst sample.

Convention: ``x_s = (1 - s) x0 + s eps``, ``v* = eps - x0``. The chosen (w) and rejected (l) latents of a pair are
noised with the same ``eps`` and the same ``s``. This module imports nothing else of sanarl.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def velocity_errors(v: Tensor, x0: Tensor, eps: Tensor) -> Tensor:
    """Per-sample flow-matching error ``mean_CHW (v - (eps - x0))^2`` ``[B]`` in float32 (x0, eps constants)."""
    if v.shape != x0.shape or v.shape != eps.shape or v.ndim < 2:
        raise ValueError(
            f"velocity_errors needs v, x0, eps of one shape [B, ...], got {tuple(v.shape)}, {tuple(x0.shape)}, "
            f"{tuple(eps.shape)}."
        )
    target = eps.detach().float() - x0.detach().float()
    return (v.float() - target).square().flatten(1).mean(dim=1)


def dpo_loss(
    err_w: Tensor, err_l: Tensor, ref_err_w: Tensor, ref_err_l: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Diffusion-DPO loss over P pairs; every input ``[P]``, the reference errors constant.

        inside = -beta / 2 ((err_w - ref_err_w) - (err_l - ref_err_l))
        L      = -mean log sigmoid(inside)

    Returns ``(L, metrics)`` (detached): implicit_acc (fraction of pairs with inside > 0), model_mse
    (``(mean err_w + mean err_l) / 2``), ref_mse (mean of both reference errors), reward_margin (mean inside).
    With the model equal to the reference, L = log 2.
    """
    shapes = {tuple(t.shape) for t in (err_w, err_l, ref_err_w, ref_err_l)}
    if len(shapes) != 1 or err_w.ndim != 1:
        raise ValueError(f"dpo_loss needs four error vectors of one shape [P], got shapes {sorted(shapes)}.")
    if not beta > 0:
        raise ValueError(f"beta_dpo must be > 0, got {beta}.")
    model_diff = err_w - err_l
    ref_diff = ref_err_w.detach() - ref_err_l.detach()
    inside = -0.5 * beta * (model_diff - ref_diff)
    loss = -F.logsigmoid(inside).mean()
    metrics = {
        "implicit_acc": (inside.detach() > 0).float().mean(),
        "model_mse": 0.5 * (err_w.detach().mean() + err_l.detach().mean()),
        "ref_mse": torch.cat([ref_err_w, ref_err_l]).detach().mean(),
        "reward_margin": inside.detach().mean(),
    }
    return loss, metrics


def best_worst_pairs(groups: Sequence[Hashable], scores: Tensor) -> list[tuple[int, int]]:
    """Online DPO pairs: for each group (samples with one key, e.g. the prompt) of at least 2 samples, the index of
    its highest score (chosen) and of its lowest (rejected), each the first such index on ties. Groups in order of
    first appearance. A group whose scores are all equal yields ``(i, i)`` (loss log 2, no gradient), as the
    reference does."""
    if scores.ndim != 1 or len(groups) != scores.shape[0]:
        raise ValueError(
            f"best_worst_pairs needs one group key per score and scores of shape [N], got {len(groups)} keys and "
            f"scores of shape {tuple(scores.shape)}."
        )
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(
            "best_worst_pairs got a NaN or infinite score; drop unscored samples before pairing."
        )
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    vals = scores.detach().to("cpu", torch.float64).tolist()
    pairs = []
    for idx in members.values():
        if len(idx) < 2:
            continue
        best = max(idx, key=lambda i: (vals[i], -i))
        worst = min(idx, key=lambda i: (vals[i], i))
        pairs.append((best, worst))
    return pairs
