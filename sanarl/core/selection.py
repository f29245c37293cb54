"""Draft selection for the Sol-RL rollout families (docs/algorithms.md, "Sol-RL rollout families").

From M scored drafts of one prompt, keep k. Every mode returns exactly k distinct indices, sorted in increasing
order, as a CPU LongTensor (index CUDA tensors with it directly). Ties are broken by index: among equal rewards
the lower index counts as the better one and also as the worse one, so the result is deterministic.

Modes:
- best_worst: the top `k // 2` plus the bottom `k - k // 2` by reward, the bottom taken from the drafts not already
  in the top (the public code can pick one index twice on ties; here never).
- random: k drafts uniformly without replacement.
- mean_deviation: the k drafts with the largest `|r - mean(r)|`.
- extremes_random (Sol-RL's): the extremes `{argmax r, argmin r}` (the first index of the largest and of the
  smallest reward; one draft when they coincide), in increasing index order, cut to k when k is smaller (k = 1
  keeps the lower index of the two, a fixed extreme); the other `k - 2` uniformly without replacement from the
  rest.
- best_worst_random: `h = k // 2` drafts by best_worst(h), then the other `k - h` uniformly without replacement
  from the drafts not yet chosen (with k = 1 one random draft). It equals extremes_random when k // 2 = 2.

Unscorable drafts (NaN reward): `select_scorable` chooses among the scorable drafts only, and keeps NaN drafts only
when fewer than k drafts are scorable (then every scorable one is kept, plus the first NaN ones).
"""

from __future__ import annotations

import torch

SELECTION_MODES = ("best_worst", "random", "mean_deviation", "extremes_random", "best_worst_random")


def _best_worst(r: torch.Tensor, k: int) -> torch.Tensor:
    """Unsorted indices: top k//2 (descending, ties -> lower index) then bottom k - k//2 of the rest."""
    n_top = k // 2
    top = torch.argsort(-r, stable=True)[:n_top]
    taken = torch.zeros(r.shape[0], dtype=torch.bool)
    taken[top] = True
    ascending = torch.argsort(r, stable=True)
    bottom = ascending[~taken[ascending]][: k - n_top]
    return torch.cat([top, bottom])


def _random_from(candidates: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    perm = torch.randperm(candidates.shape[0], generator=generator)
    return candidates[perm[:k]]


def _extremes_random(r: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """Sol-RL's extremes_random: sorted unique {first argmax, first argmin}[:k], then random from the rest."""
    best = int(torch.argsort(-r, stable=True)[0])
    worst = int(torch.argsort(r, stable=True)[0])
    extremes = torch.tensor(sorted({best, worst}), dtype=torch.long)
    if k <= extremes.shape[0]:
        return extremes[:k]
    taken = torch.zeros(r.shape[0], dtype=torch.bool)
    taken[extremes] = True
    rest = torch.nonzero(~taken).flatten()
    return torch.cat([extremes, _random_from(rest, k - extremes.shape[0], generator)])


def _best_worst_random(r: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    extremes = _best_worst(r, k // 2)
    taken = torch.zeros(r.shape[0], dtype=torch.bool)
    taken[extremes] = True
    middle = torch.nonzero(~taken).flatten()
    return torch.cat([extremes, _random_from(middle, k - extremes.shape[0], generator)])


def select_indices(
    rewards: torch.Tensor, k: int, mode: str, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Choose k of M drafts by `mode` (see the module docstring).

    rewards: `[M]` finite scores of one prompt's drafts. generator: a CPU generator for the random modes.
    Returns a LongTensor `[k]` of distinct indices in increasing order. Raises ValueError for k < 1, k > M, an
    unknown mode or NaN rewards.
    """
    if rewards.ndim != 1:
        raise ValueError(f"select_indices needs rewards of shape [M], got {tuple(rewards.shape)}.")
    m = rewards.shape[0]
    if k < 1 or k > m:
        raise ValueError(
            f"cannot keep k={k} of {m} drafts: k must be in [1, {m}]; raise the number of drafts per prompt or "
            "lower the number kept."
        )
    if mode not in SELECTION_MODES:
        raise ValueError(f"unknown selection mode {mode!r}; use one of {', '.join(SELECTION_MODES)}.")
    r = rewards.detach().to("cpu", torch.float64)
    if bool(torch.isnan(r).any()):
        raise ValueError("select_indices got NaN rewards; drop or re-score those drafts before selecting.")
    if mode == "best_worst":
        idx = _best_worst(r, k)
    elif mode == "random":
        idx = _random_from(torch.arange(m), k, generator)
    elif mode == "mean_deviation":
        idx = torch.argsort(-(r - r.mean()).abs(), stable=True)[:k]
    elif mode == "extremes_random":
        idx = _extremes_random(r, k, generator)
    else:
        idx = _best_worst_random(r, k, generator)
    return torch.sort(idx).values


def select_scorable(
    rewards: torch.Tensor, k: int, mode: str, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """`select_indices` over the drafts with a finite reward; a NaN draft is never kept while a scorable one is
    left out. rewards `[M]` (NaN = unscorable). Returns k distinct sorted indices (LongTensor)."""
    if rewards.ndim != 1:
        raise ValueError(f"select_scorable needs rewards of shape [M], got {tuple(rewards.shape)}.")
    nan = torch.isnan(rewards.detach().cpu())
    scorable = (~nan).nonzero().flatten()
    if len(scorable) >= k:
        chosen = scorable[select_indices(rewards.detach().cpu()[scorable], k, mode, generator=generator)]
    else:
        if k > rewards.shape[0]:
            raise ValueError(
                f"cannot keep k={k} of {rewards.shape[0]} drafts: k must be in [1, {rewards.shape[0]}]."
            )
        chosen = torch.cat([scorable, nan.nonzero().flatten()[: k - len(scorable)]])
    return torch.sort(chosen).values
