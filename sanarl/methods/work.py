"""What one optimizer step trains per training sample, counted in rows of the transformer's forward.

Each method's config.py declares its own `trained_work`; the capacity plan (sanarl/tools/capacity) multiplies it
by a family's cost per row, so the plan never asks which method it is. A trained forward costs three forwards
(forward + backward); a forward without gradient (the old policy, the reference, a CFG target) costs one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GuidedRows = Callable[[int, float], int]
"""Rows of one forward over `batch` samples at guidance weight w (CFG doubles them where the family batches its
branches; a guidance-distilled family does not)."""


@dataclass(frozen=True)
class TrainedWork:
    levels: int
    """Noise levels (or SDE steps) trained per sample and step: one trained forward + backward each."""
    rows: float
    """Rows of each trained forward per sample (CFG branches, DDRL's data row, SOAR's auxiliary targets)."""
    frozen_rows: float = 0.0
    """Rows of forwards without gradient per sample and step, over all its levels."""

    def forward_rows(self) -> float:
        """Forward-equivalent rows per sample and step (a backward costs two forwards)."""
        return self.levels * self.rows * 3 + self.frozen_rows
