"""Diffusion-DPO's config views and checks, offline and online (docs/algorithms.md, "Diffusion-DPO"; docs/dpo.md for
the keys). Offline (`type = "sft"`, `trainer_type = "dpo"`) trains on the pair items of a dataset plugin; online
(`type = "grpo"`, `trainer_type = "dpo"`) on the best and worst of each rollout group."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.checks import require
from sanarl.config.group_rl_schema import GroupPolicy
from sanarl.config.schema import Config, DiffusersConfig, DPOConfig
from sanarl.methods.group_rl.config import (
    GroupRLView,
    check_group_rl,
    check_steps_per_rollout,
    group_sections,
    keys_of,
    rollouts_for,
)
from sanarl.methods.sft.config import warnings as sft_warnings
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

KEY = "train.train_policy.dpo"
PAIR_ROWS = 2
"""Rows of each trained forward per pair: the chosen and the rejected latent, at one level and one noise."""


@dataclass(frozen=True)
class DPOView:
    """What offline DPO reads: `[train.train_policy.dpo]` and the diffusers keys (the level's weighting scheme, the
    shift, caption dropout, VAE latents), as SFT."""

    dpo: DPOConfig
    diffusers: DiffusersConfig


@dataclass(frozen=True)
class DPOOnlineView(GroupRLView[GroupPolicy]):
    """The group-RL sections (rollout, rewards, advantages) plus `[train.train_policy.dpo]`."""

    dpo: DPOConfig


def view(cfg: Config) -> DPOView:
    return DPOView(cfg.train.train_policy.dpo, cfg.policy.diffusers)


def online_view(cfg: Config) -> DPOOnlineView:
    return DPOOnlineView(
        keys_of(GroupPolicy, cfg.train.train_policy), *group_sections(cfg), cfg.train.train_policy.dpo
    )


def warnings(cfg: Config) -> list[str]:
    """SFT's: offline DPO is a method of type "sft", which ignores the RL keys."""
    return sft_warnings(cfg)


def validate_online(cfg: Config) -> None:
    """Online DPO's checks (ConfigError naming the key and the fix): prompt groups of K >= 2 and a reward, the
    updates per rollout, and the plain rollout of the current policy."""
    check_group_rl(cfg)
    ro = cfg.rollout
    require(
        ro.family == "diffusionnft" and ro.num_candidates in (0, ro.n_generation),
        f"rollout.family = {ro.family!r} with rollout.num_candidates = {ro.num_candidates}: online DPO samples its "
        "K images per prompt from the current policy and pairs the best with the worst, without a draft search or "
        'inference copies; set rollout.family = "diffusionnft" and num_candidates = 0.',
    )
    _check_pair_chunks(cfg)
    check_steps_per_rollout(cfg)


def _check_pair_chunks(cfg: Config) -> None:
    """`mini_batch` counts rollout samples, as in every group-RL method: a micro-batch trains the pairs of
    mini_batch / K whole groups."""
    mb, k = cfg.train.train_policy.mini_batch, cfg.rollout.n_generation
    require(
        mb % k == 0,
        f"train.train_policy.mini_batch = {mb} is not a multiple of rollout.n_generation = {k}: online DPO trains "
        f"one pair per group of {k} samples, so a micro-batch of mini_batch samples holds mini_batch / {k} pairs; "
        f"set mini_batch to a multiple of {k} (e.g. {k * max(1, mb // k)}).",
    )


def online_warnings(cfg: Config) -> list[str]:
    """The group-RL keys online DPO does not read: the KL weight (the DPO loss holds its own reference term) and the
    advantage clip (a pair needs only the order inside its group)."""
    tp, out = cfg.train.train_policy, []
    if tp.kl_beta > 0:
        out.append(
            f"train.train_policy.kl_beta = {tp.kl_beta} has no effect for online DPO (its loss compares the policy "
            f"with the reference through `{KEY}.beta_dpo`); it is ignored."
        )
    return out


def plan(cfg: Config) -> StepPlan:
    """One level per pair, shared by its chosen and rejected latent."""
    return StepPlan(levels=1, rule="one level per pair, shared by chosen and rejected")


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """Offline, per pair: one trained forward over its two latents and the reference's forward over the same two."""
    return TrainedWork(levels=plan(cfg).levels, rows=PAIR_ROWS, frozen_rows=PAIR_ROWS)


def online_trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """Online, per rollout sample: a group of K samples gives one pair, so the pair's rows spread over K samples."""
    per_sample = PAIR_ROWS / cfg.rollout.n_generation
    return TrainedWork(levels=plan(cfg).levels, rows=per_sample, frozen_rows=per_sample)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """Offline DPO generates no images and calls no reward."""
    return 0, 0


def online_rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls): `train_batch_per_replica` samples per rollout, each scored once."""
    images = rollouts_for(cfg, steps) * cfg.train.train_batch_per_replica
    return images, images
