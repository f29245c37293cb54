"""SOAR's config view, checks and warnings (docs/algorithms.md, "SOAR"; docs/soar.md for the keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from sanarl.config.choices import LevelGrid, SoarRolloutType
from sanarl.config.schema import Config, DiffusersConfig, SoarConfig
from sanarl.errors import ConfigError
from sanarl.methods.sft.config import warnings as sft_warnings
from sanarl.methods.work import GuidedRows, TrainedWork

ROLLOUT_TYPES: tuple[str, ...] = get_args(SoarRolloutType)
"""Accepted `train.train_policy.soar.sde_rollout_type` values (the step of paths 1..M-1)."""
LEVEL_GRIDS: tuple[str, ...] = get_args(LevelGrid)
"""Accepted `train.train_policy.soar.level_grid` values (how s0 and s1 are read off u and t1; `soar_levels`)."""
SCHEDULER_TABLE_SIZE = 1000
"""Levels of HY-SOAR's training table: the `num_train_timesteps` of SD3.5's FlowMatchEulerDiscreteScheduler."""
KEY = "train.train_policy.soar"


def check_soar_config(soar: SoarConfig) -> None:
    """Raise ConfigError (naming the key and the fix) for SOAR settings outside their domain."""
    checks = [
        (
            soar.num_rollout_paths >= 1,
            "num_rollout_paths",
            "must be >= 1 (1 = the ODE path only, the default)",
        ),
        (
            soar.trajectory_length >= 1,
            "trajectory_length",
            "must be >= 1 auxiliary point per path (default 6)",
        ),
        (
            soar.num_sampling_steps >= 1,
            "num_sampling_steps",
            "must be >= 1 (the rollout step is 1/N in t; 40)",
        ),
        (soar.sigma_upper_ratio >= 1.0, "sigma_upper_ratio", "must be >= 1 so that s_up >= s1 (default 1.5)"),
        (soar.lambda_aux >= 0.0, "lambda_aux", "must be >= 0 (0 = plain flow matching; default 1.0)"),
        (soar.sde_noise_scale >= 0.0, "sde_noise_scale", "must be >= 0 (default 0.5)"),
        (
            soar.sde_rollout_type in ROLLOUT_TYPES,
            "sde_rollout_type",
            f"must be one of {', '.join(ROLLOUT_TYPES)} (default flow_sde)",
        ),
        (
            soar.level_grid in LEVEL_GRIDS,
            "level_grid",
            f"must be one of {', '.join(LEVEL_GRIDS)} (default scheduler_table, as HY-SOAR)",
        ),
        (
            soar.level_grid != "scheduler_table" or soar.num_sampling_steps <= SCHEDULER_TABLE_SIZE,
            "num_sampling_steps",
            f"must be <= {SCHEDULER_TABLE_SIZE} with level_grid = scheduler_table (a step finer than the table "
            "reads s1 = s0); or set level_grid = continuous",
        ),
    ]
    for ok, name, rule in checks:
        if not ok:
            raise ConfigError(
                f"`{KEY}.{name}` = {getattr(soar, name)!r} {rule}; fix it in the preset or with "
                f"`--set {KEY}.{name}=...`."
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


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward over the sample and its num_rollout_paths x trajectory_length auxiliary targets, plus
    the no-grad CFG forward that makes the targets."""
    soar = cfg.train.train_policy.soar
    return TrainedWork(
        levels=1,
        rows=1 + soar.num_rollout_paths * soar.trajectory_length,
        frozen_rows=guided(1, soar.cfg_scale_sampling),
    )


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls) of `steps` optimizer steps: `num_rollout_paths` reward-free ODE rollouts
    per training image, no reward calls."""
    return steps * cfg.train.train_batch_per_replica * cfg.train.train_policy.soar.num_rollout_paths, 0
