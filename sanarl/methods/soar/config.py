"""SOAR's config view, checks and warnings (docs/algorithms.md, "SOAR"; docs/soar.md for the keys)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.schema import Config, DiffusersConfig, SoarConfig
from sanarl.errors import ConfigError
from sanarl.methods.sft.config import warnings as sft_warnings
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

SCHEDULER_TABLE_SIZE = 1000
"""Levels of HY-SOAR's training table: the `num_train_timesteps` of SD3.5's FlowMatchEulerDiscreteScheduler."""
KEY = "train.train_policy.soar"


def check_soar_config(soar: SoarConfig) -> None:
    """SOAR's cross-field check (its ranges and choices are declared on `SoarConfig`'s fields): the scheduler
    table's 1000 levels bound the rollout's steps (ConfigError naming the key and the fix)."""
    if soar.level_grid == "scheduler_table" and soar.num_sampling_steps > SCHEDULER_TABLE_SIZE:
        raise ConfigError(
            f"`{KEY}.num_sampling_steps` = {soar.num_sampling_steps} must be <= {SCHEDULER_TABLE_SIZE} with "
            "level_grid = scheduler_table (a step finer than the table reads s1 = s0); set level_grid = continuous "
            f"or lower it in the preset or with `--set {KEY}.num_sampling_steps=...`."
        )


@dataclass(frozen=True)
class SOARView:
    """The sections SOAR reads: `[train.train_policy.soar]` and the diffusers keys (weighting, caption dropout,
    the rollout sampler's guidance and shift)."""

    soar: SoarConfig
    diffusers: DiffusersConfig


def view(cfg: Config) -> SOARView:
    return SOARView(cfg.train.train_policy.soar, cfg.policy.diffusers)


def validate(cfg: Config) -> None:
    """SOAR's own checks: every `[train.train_policy.soar]` value inside its domain."""
    check_soar_config(view(cfg).soar)


def warnings(cfg: Config) -> list[str]:
    """SFT's: SOAR is an SFT method (type "sft"), which ignores the RL keys."""
    return sft_warnings(cfg)


def plan(cfg: Config) -> StepPlan:
    """One trained forward per sample: its main level and its auxiliary targets share it."""
    return StepPlan(levels=1, rule="one forward per sample over its main level and auxiliary targets")


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward over the sample and its num_rollout_paths x trajectory_length auxiliary targets, plus
    the no-grad CFG forward that makes the targets."""
    soar = cfg.train.train_policy.soar
    return TrainedWork(
        levels=plan(cfg).levels,
        rows=1 + soar.num_rollout_paths * soar.trajectory_length,
        frozen_rows=guided(1, soar.cfg_scale_sampling),
    )


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls) of `steps` optimizer steps: `num_rollout_paths` reward-free ODE rollouts
    per training image, no reward calls."""
    return steps * cfg.train.train_batch_per_replica * cfg.train.train_policy.soar.num_rollout_paths, 0
