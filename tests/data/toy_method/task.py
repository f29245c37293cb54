"""The toy method's task: SFT's step with its loss scaled by `config.LOSS_SCALE`."""

from __future__ import annotations

import torch

from sanarl.methods.sft.task import SFTBatch, SFTTask
from toy_method.config import LOSS_SCALE


class ToyTask(SFTTask):
    def objective(self, batch: SFTBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().objective(batch, rng)
        return LOSS_SCALE * loss, {**metrics, "loss": LOSS_SCALE * metrics["loss"]}
