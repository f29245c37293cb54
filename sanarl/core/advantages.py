"""Advantages (docs/algorithms.md, "Advantages and reward combination", and the NFT `adv_mode` of "DiffusionNFT");
the rewards are combined, weights included, in sanarl/rewards/combine.py.

Everything here is a pure function of tensors (plus one small stateful tracker whose state is only the statistics
of its last call). NaN rewards are never handled silently: `nan_mask` finds them, and callers drop those samples
(and, for grouped advantages, their whole prompt group if it becomes empty) before calling
`PerPromptStatTracker.compute`, which rejects non-finite rewards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

STD_EPS = 1e-4
"""Added to the std in `A = (R - mean) / (std + STD_EPS)` (Flow-GRPO / DiffusionNFT stat tracker)."""

NFT_ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")
"""Accepted values of `adv_mode` in `nft_adv_transform`."""


def _check_rewards_1d(rewards: torch.Tensor, what: str) -> None:
    if not isinstance(rewards, torch.Tensor) or rewards.ndim != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(
            f"{what} must be a 1-D tensor of shape [N], got {shape}; flatten it before the call."
        )


def group_indices(prompts: Sequence[str]) -> dict[str, list[int]]:
    """Indices of each distinct prompt, keyed on the raw prompt string, in first-appearance order."""
    groups: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt, []).append(i)
    return groups


class PerPromptStatTracker:
    """Per-prompt advantage normaliser: `A = (R - mean_group(R)) / (std + 1e-4)`.

    Groups are formed by the raw prompt string. `std` is the std of all rewards of the call when `global_std` is
    true (the published default), otherwise of the sample's own group: the population std (divide by N, numpy's
    `np.std` as Flow-GRPO and DiffusionNFT) by default, the sample std (divide by N - 1, `torch.std` as Cosmos-RL's
    DDRL) with `unbiased`. Stateless across calls except that `stats()` reports on the most recent `compute`.
    """

    def __init__(self, global_std: bool = True, *, unbiased: bool = False) -> None:
        self.global_std = global_std
        self.unbiased = unbiased
        self._stats: dict[str, float] = {"zero_std_ratio": 0.0, "mean_group_std": 0.0, "num_groups": 0.0}

    def compute(self, prompts: Sequence[str], rewards: torch.Tensor) -> torch.Tensor:
        """Advantages `[N]` (dtype of `rewards`) for `prompts` (N strings) and `rewards` `[N]`.

        Raises ValueError when the lengths differ, `rewards` is not 1-D, or a reward is NaN/inf (drop those samples
        first, see `nan_mask`).
        """
        _check_rewards_1d(rewards, "rewards")
        if len(prompts) != rewards.shape[0]:
            raise ValueError(
                f"PerPromptStatTracker.compute got {len(prompts)} prompts but {rewards.shape[0]} rewards; pass one "
                "prompt string per reward (repeat each prompt once per image of its group)."
            )
        if not bool(torch.isfinite(rewards).all()):
            bad = int((~torch.isfinite(rewards)).sum())
            raise ValueError(
                f"PerPromptStatTracker.compute got {bad} non-finite reward(s); drop those samples before computing "
                "advantages (use sanarl.core.advantages.nan_mask to find them)."
            )
        r = rewards.detach().to(torch.float64)
        adv = torch.zeros_like(r)
        correction = 1 if self.unbiased else 0
        global_sd = r.std(correction=correction) if r.numel() > correction else r.new_zeros(())
        group_sds: list[float] = []
        zero_groups = 0
        for idx in group_indices(prompts).values():
            g = r[idx]
            group_sd = g.std(correction=correction) if len(idx) > correction else g.new_zeros(())
            group_sds.append(float(group_sd))
            zero_groups += int(bool((g == g[0]).all()))
            sd = global_sd if self.global_std else group_sd
            adv[idx] = (g - g.mean()) / (sd + STD_EPS)
        n_groups = len(group_sds)
        self._stats = {
            "zero_std_ratio": zero_groups / n_groups if n_groups else 0.0,
            "mean_group_std": sum(group_sds) / n_groups if n_groups else 0.0,
            "num_groups": float(n_groups),
        }
        out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return adv.to(out_dtype)

    def stats(self) -> dict[str, float]:
        """Statistics of the last `compute`: zero_std_ratio (fraction of groups whose rewards are all equal),
        mean_group_std (mean over groups of the std, as the normaliser computes it), num_groups."""
        return dict(self._stats)


def clip_advantages(adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """`clamp(adv, low, high)` (config `advantage_low` / `advantage_high`, low < high checked at config load);
    any shape."""
    return adv.clamp(low, high)


def nft_adv_transform(adv: torch.Tensor, mode: str, clip_max: float) -> torch.Tensor:
    """DiffusionNFT advantage transform (docs/algorithms.md, "DiffusionNFT", `adv_mode`); any shape, same shape out.

    all: clamp(A, -C, C); positive_only: clamp(A, 0, C); negative_only: clamp(A, -C, 0); one_only: 1[A > 0];
    binary: sign(A). C = `clip_max` (> 0: the range of `advantage_high`, checked at config load).
    """
    if mode == "all":
        return adv.clamp(-clip_max, clip_max)
    if mode == "positive_only":
        return adv.clamp(0.0, clip_max)
    if mode == "negative_only":
        return adv.clamp(-clip_max, 0.0)
    if mode == "one_only":
        return (adv > 0).to(adv.dtype)
    if mode == "binary":
        return torch.sign(adv)
    raise ValueError(f"unknown adv_mode {mode!r}; use one of {', '.join(NFT_ADV_MODES)}.")


def nan_mask(total: torch.Tensor) -> torch.Tensor:
    """Bool mask `[B]`, true where `total` `[B]` is NaN. Callers drop these samples before computing advantages."""
    return torch.isnan(total)
