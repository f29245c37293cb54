"""SFT's config view (docs/algorithms.md, "SFT"); it has no checks beyond the loader's generic ones."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.schema import Config, DatasetConfig, DiffusersConfig, LoraConfig


@dataclass(frozen=True)
class SFTView:
    """The sections SFT reads: the diffusers keys (weighting scheme, caption dropout, shift, VAE latents), the
    training dataset and the LoRA adapters (or none: full fine-tune)."""

    diffusers: DiffusersConfig
    dataset: DatasetConfig
    lora: LoraConfig | None


def view(cfg: Config) -> SFTView:
    return SFTView(cfg.policy.diffusers, cfg.train.train_policy.dataset, cfg.policy.lora)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """SFT generates no images and calls no reward."""
    return 0, 0
