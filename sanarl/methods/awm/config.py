"""AWM's config view and checks (docs/algorithms.md, "AWM"; docs/awm.md for the keys)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.awm_schema import AWMConfig
from sanarl.config.checks import require
from sanarl.config.group_rl_schema import ClippedPolicy
from sanarl.config.schema import Config
from sanarl.methods.group_rl.config import (
    GroupRLView,
    check_group_rl,
    check_steps_per_rollout,
    group_sections,
    keys_of,
    rollouts_for,
)
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

KEY = "train.train_policy.awm"
SAMPLED_FAMILIES = ("diffusionnft", "naive_scaling")
"""Rollout families that sample with the live policy (the others fold an "old" adapter into inference copies)."""


@dataclass(frozen=True)
class AWMView(GroupRLView[ClippedPolicy]):
    """The group-RL keys with the clip range, the rollout and diffusers sections, plus `[train.train_policy.awm]`."""

    awm: AWMConfig


def view(cfg: Config) -> AWMView:
    tp = cfg.train.train_policy
    return AWMView(keys_of(ClippedPolicy, tp), *group_sections(cfg), tp.awm)


def trained_range(time_type: str, num_steps: int, fraction: float) -> tuple[int, int, int]:
    """(lowest step of the strata, m = int(num_steps x fraction), the most levels the strata can hold) of a
    time type: its strata need integer boundaries at least one step apart (sanarl.core.awm_loss)."""
    top = int(num_steps * fraction)
    if time_type == "discrete":
        return 0, top, top
    # discrete_wo_init: T strata of [1, m]; discrete_with_init: step 0 plus T - 1 strata of [1, m]
    return 1, top, max(0, top - 1) + (1 if time_type == "discrete_with_init" else 0)


def validate(cfg: Config) -> None:
    """AWM's cross-field checks (ConfigError naming the key and the fix), in the order they report."""
    check_group_rl(cfg)
    tp, ro = cfg.train.train_policy, cfg.rollout
    require(
        tp.advantage_low == -tp.advantage_high,
        f"train.train_policy.advantage_low = {tp.advantage_low} has no effect for awm, which clips advantages to "
        f"[-C, C] with C = advantage_high = {tp.advantage_high} (AWM's adv_clip_max); set advantage_low = "
        f"{-tp.advantage_high}.",
    )
    require(
        ro.family in SAMPLED_FAMILIES,
        f"rollout.family = {ro.family!r} samples from inference copies of DiffusionNFT's old adapter; AWM samples "
        f"with the policy itself: use rollout.family = {' or '.join(repr(f) for f in SAMPLED_FAMILIES)}.",
    )
    if ro.family == "naive_scaling":
        require(
            ro.num_candidates >= ro.n_generation,
            f"rollout.family = 'naive_scaling' keeps rollout.n_generation = {ro.n_generation} of "
            f"rollout.num_candidates drafts per prompt; set num_candidates >= {ro.n_generation}.",
        )
    check_awm_config(cfg)
    check_steps_per_rollout(cfg)


def check_awm_config(cfg: Config) -> None:
    """`[train.train_policy.awm]` against the grid and the model (ConfigError naming the key and the fix)."""
    a, lora = cfg.train.train_policy.awm, cfg.policy.lora
    n, fraction = cfg.policy.diffusers.sample.num_steps, cfg.policy.diffusers.timesteps_fraction
    low, top, most = trained_range(a.time_type, n, fraction)
    require(
        a.train_timesteps <= most,
        f"`{KEY}.train_timesteps` = {a.train_timesteps} asks for more trained levels than `{KEY}.time_type` = "
        f"{a.time_type!r} can stratify: policy.diffusers.sample.num_steps = {n} x policy.diffusers."
        f"timesteps_fraction = {fraction} leaves m = {top}, so the strata of [{low}, {top}] hold at most {most} "
        f"distinct steps; set train_timesteps <= {most} or raise num_steps / timesteps_fraction.",
    )
    if a.ema_beta > 0 and lora is not None:
        require(
            "ema" in lora.lora_names,
            f'`{KEY}.ema_beta` = {a.ema_beta} keeps the EMA copy of the policy in a LoRA adapter named "ema"; '
            f"add it: policy.lora.lora_names = {[*lora.lora_names, 'ema']!r} (or set ema_beta = 0).",
        )
    require(
        a.ema_beta == 0 or lora is not None,
        f"`{KEY}.ema_beta` = {a.ema_beta} needs a [policy.lora] table: the EMA copy it pulls towards is a LoRA "
        'adapter ("ema", checkpointed with the others); a full fine-tune has none, so set ema_beta = 0 there.',
    )


def warnings(cfg: Config) -> list[str]:
    """Valid settings AWM does not honour the way one might expect."""
    notes = []
    sample = cfg.policy.diffusers.sample
    if sample.guidance_scale != 1.0:
        notes.append(
            f"policy.diffusers.sample.guidance_scale = {sample.guidance_scale}: AWM rolls out with that guidance but "
            "trains the CFG-free velocity (the published run samples with guidance 1)."
        )
    return notes


def plan(cfg: Config) -> StepPlan:
    """Each kept sample trains `train_timesteps` levels of the rollout grid, stratified per micro-batch."""
    a = cfg.train.train_policy.awm
    n, fraction = cfg.policy.diffusers.sample.num_steps, cfg.policy.diffusers.timesteps_fraction
    low, top, _ = trained_range(a.time_type, n, fraction)
    rule = f"train_timesteps, {a.time_type} strata of [{low}, int({n} x {fraction}) = {top}]"
    return StepPlan(levels=a.train_timesteps, rule=rule)


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained row per trained level (CFG-free), all levels of a sample in one forward, plus the base's forward
    with kl_beta and the EMA copy's with ema_beta."""
    levels = plan(cfg).levels
    tp = cfg.train.train_policy
    frozen = (1 if tp.kl_beta > 0 else 0) + (1 if tp.awm.ema_beta > 0 else 0)
    return TrainedWork(levels=levels, rows=1, frozen_rows=levels * frozen, levels_per_forward=levels)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls) of `steps` optimizer steps: `train_batch_per_replica` samples per rollout
    (naive_scaling: `num_candidates` drafts per prompt), each scored once."""
    rollouts, batch, ro = rollouts_for(cfg, steps), cfg.train.train_batch_per_replica, cfg.rollout
    per_rollout = batch
    if ro.family == "naive_scaling":
        per_rollout = (batch // ro.n_generation) * (ro.num_candidates or ro.n_generation)
    return rollouts * per_rollout, rollouts * per_rollout
