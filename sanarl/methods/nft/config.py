"""DiffusionNFT's config view and checks (docs/algorithms.md, "DiffusionNFT"; docs/nft.md for the keys)."""

from __future__ import annotations

from sanarl.config.checks import require
from sanarl.config.group_rl_schema import NFTPolicy
from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods.group_rl.config import (
    GroupRLView,
    check_group_rl,
    check_rollout_family,
    check_steps_per_rollout,
    group_view,
    rollouts_for,
)
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork, fraction_levels

NFTView = GroupRLView[NFTPolicy]
"""The group-RL sections with DiffusionNFT's policy keys; its beta and old-adapter decay are diffusers keys."""


def view(cfg: Config) -> NFTView:
    return group_view(cfg, NFTPolicy)


def validate(cfg: Config) -> None:
    """DiffusionNFT's cross-field checks (ConfigError naming the key and the fix), in the order they report."""
    check_group_rl(cfg)
    tp, lora = cfg.train.train_policy, cfg.policy.lora
    # exactness: DiffusionNFT clips symmetrically at C = advantage_high; a separate lower bound is not honoured
    require(
        tp.advantage_low == -tp.advantage_high,
        f"train.train_policy.advantage_low = {tp.advantage_low} has no effect for diffusion_nft, which clips "
        f"advantages to [-C, C] with C = advantage_high = {tp.advantage_high} (DiffusionNFT's adv_clip_max); "
        f"set advantage_low = {-tp.advantage_high} (or use adv_mode = 'positive_only' for A >= 0).",
    )
    check_rollout_family(cfg)
    if lora is None:
        raise ConfigError(
            "trainer_type = 'diffusion_nft' trains a LoRA adapter against an 'old' one; add a [policy.lora] "
            'table (e.g. r = 4, lora_alpha = 4, lora_names = ["default", "old"]).'
        )
    require(
        "old" in lora.lora_names,
        f'`policy.lora.lora_names` = {lora.lora_names!r} lacks "old": DiffusionNFT keeps its behaviour policy in '
        'an adapter named "old"; set lora_names = ["default", "old"].',
    )
    check_steps_per_rollout(cfg)


def warnings(cfg: Config) -> list[str]:
    """DiffusionNFT warns of nothing beyond the generic notes."""
    return []


def plan(cfg: Config) -> StepPlan:
    """Each kept sample trains int(num_steps x timesteps_fraction) distinct levels of the rollout grid (at least
    one), drawn per sample."""
    n, fraction = cfg.policy.diffusers.sample.num_steps, cfg.policy.diffusers.timesteps_fraction
    return StepPlan(levels=fraction_levels(n, fraction), rule=f"int({n} x {fraction})")


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward per trained level (`plan`), each with the old policy's forward and, with kl_beta, the
    reference's."""
    levels = plan(cfg).levels
    frozen = 1 + (1 if cfg.train.train_policy.kl_beta > 0 else 0)
    return TrainedWork(levels=levels, rows=1, frozen_rows=levels * frozen)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls) of `steps` optimizer steps: `train_batch_per_replica` samples per rollout,
    each scored once; a Sol-RL search family also generates and scores `num_candidates` drafts per prompt."""
    rollouts, batch, ro = rollouts_for(cfg, steps), cfg.train.train_batch_per_replica, cfg.rollout
    per_rollout = batch
    if ro.family == "sol_rl":
        per_rollout = (batch // ro.n_generation) * ((ro.num_candidates or ro.n_generation) + ro.n_generation)
    return rollouts * per_rollout, rollouts * per_rollout
