"""SFT's config view and warnings (docs/algorithms.md, "SFT"); it has no checks beyond the loader's generic ones."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.schema import Config, DiffusersConfig
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork


@dataclass(frozen=True)
class SFTView:
    """The section SFT reads: the diffusers keys (weighting scheme, caption dropout, shift, VAE latents). Its
    dataset goes to the plugin and its LoRA is a run-level key (`training.protocol.RunSettings`)."""

    diffusers: DiffusersConfig


def view(cfg: Config) -> SFTView:
    return SFTView(cfg.policy.diffusers)


def warnings(cfg: Config) -> list[str]:
    """The `[train.train_policy]` keys of the RL methods, which SFT (and every method of type "sft") ignores."""
    tp = cfg.train.train_policy
    out = []
    if tp.kl_beta > 0:
        out.append(f"train.train_policy.kl_beta = {tp.kl_beta} has no effect for SFT; it is ignored.")
    if tp.use_remote_reward or tp.remote_reward.reward_fns:
        out.append(
            "train.train_policy.remote_reward / use_remote_reward have no effect for SFT; they are ignored."
        )
    return out


def plan(cfg: Config) -> StepPlan:
    """One noise level per training sample, drawn from the weighting scheme."""
    return StepPlan(levels=1, rule="one level per sample")


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward of the training rows per sample and level."""
    return TrainedWork(levels=plan(cfg).levels, rows=1)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """SFT generates no images and calls no reward."""
    return 0, 0
