"""What one optimizer step trains per training sample: the levels (`StepPlan`) and the rows of the transformer's
forward (`TrainedWork`).

Each method's config.py declares its `plan(cfg)`, the one count of levels the run trains, the printed plan
(`Task.describe`, `sanarl validate`) shows and the capacity plan prices; its `trained_work` builds on that count,
and the capacity plan (sanarl/tools/capacity) multiplies it by a family's cost per row, so the plan never asks
which method it is. A trained forward costs three forwards (forward + backward); a forward without gradient (the
old policy, the reference, a CFG target) costs one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GuidedRows = Callable[[int, float], int]
"""Rows of one forward over `batch` samples at guidance weight w (CFG doubles them where the family batches its
branches; a guidance-distilled family does not)."""


def fraction_levels(num_steps: int, fraction: float) -> int:
    """Levels trained out of a rollout grid of `num_steps`: int(num_steps x timesteps_fraction), at least one (as
    DiffusionNFT's and Flow-GRPO's `num_train_timesteps`)."""
    return max(1, int(num_steps * fraction))


@dataclass(frozen=True)
class StepPlan:
    """What each training sample trains in one rollout (or batch), from the config alone."""

    levels: int
    """Noise levels (or SDE steps) trained per sample: one trained forward + backward each."""
    rule: str
    """Where the count comes from, as the printed plan shows it (e.g. "int(10 x 0.99)")."""


@dataclass(frozen=True)
class TrainedWork:
    levels: int
    """Noise levels (or SDE steps) trained per sample and step: one trained forward + backward each."""
    rows: float
    """Rows of each trained forward per sample (CFG branches, DDRL's data row, SOAR's auxiliary targets)."""
    frozen_rows: float = 0.0
    """Rows of forwards without gradient per sample and step, over all its levels."""
    levels_per_forward: int = 1
    """Levels one trained forward holds per sample (AWM stacks all its levels of a sample in one forward): the
    memory plan's rows of a forward; the compute is the same."""

    def forward_rows(self) -> float:
        """Forward-equivalent rows per sample and step (a backward costs two forwards)."""
        return self.levels * self.rows * 3 + self.frozen_rows
