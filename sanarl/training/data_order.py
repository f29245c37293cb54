"""Deterministic data order: which dataset items rank r uses at optimizer step k.

The stream of sample positions p = 0, 1, 2, ... runs through one permutation of the dataset per epoch (seeded by
`seed + epoch`). Step k on rank r of a world of W ranks takes positions
`k * W * B + r * B + j`, j < B (B = per-rank batch). Being a pure function of (seed, step, rank), it needs no saved
state: resuming at step k continues exactly where an uninterrupted run would be, and ranks never overlap.
"""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=4)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return tuple(torch.randperm(size, generator=gen).tolist())


def step_indices(size: int, seed: int, step: int, *, rank: int, world: int, per_rank: int) -> list[int]:
    """Dataset indices of (step, rank); the data epoch is `position // size`."""
    if size <= 0:
        raise ValueError("the dataset is empty")
    first = step * world * per_rank + rank * per_rank
    out = []
    for pos in range(first, first + per_rank):
        epoch, offset = divmod(pos, size)
        out.append(_permutation(size, seed, epoch)[offset])
    return out


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The CPU generator of (seed, step, rank): timesteps, noise and dropout of a step come from it only."""
    return torch.Generator().manual_seed((seed * 7_919 + rank) * 1_000_003 + step)


def split_batch(batch: dict, size: int) -> list[dict]:
    """Cut a collated batch into micro-batches of `size` rows."""
    n = len(next(iter(batch.values())))
    return [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, n, size)]
