"""SFT's config view (docs/algorithms.md, "SFT"); it has no checks beyond the loader's generic ones."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.schema import Config, DatasetConfig, DiffusersConfig, LoraConfig
from sanarl.methods.work import GuidedRows, TrainedWork


@dataclass(frozen=True)
class SFTView:
    """The sections SFT reads: the diffusers keys (weighting scheme, caption dropout, shift, VAE latents), the
    training dataset and the LoRA adapters (or none: full fine-tune)."""

    diffusers: DiffusersConfig
    dataset: DatasetConfig
    lora: LoraConfig | None


def view(cfg: Config) -> SFTView:
    return SFTView(cfg.policy.diffusers, cfg.train.train_policy.dataset, cfg.policy.lora)


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward of the training rows per sample."""
    return TrainedWork(levels=1, rows=1)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """SFT generates no images and calls no reward."""
    return 0, 0
