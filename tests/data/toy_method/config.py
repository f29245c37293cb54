"""The toy method's config view, checks and warnings: SFT's sections and warnings, and a learning rate it refuses
above 0.1."""

from __future__ import annotations

from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods.sft.config import SFTView
from sanarl.methods.sft.config import plan as sft_plan
from sanarl.methods.sft.config import view as sft_view
from sanarl.methods.sft.config import warnings as sft_warnings
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

LOSS_SCALE = 2.0
"""The toy objective is SFT's flow-matching loss times this."""


def view(cfg: Config) -> SFTView:
    return sft_view(cfg)


def validate(cfg: Config) -> None:
    if cfg.train.optm_lr > 0.1:
        raise ConfigError(
            f"train.optm_lr = {cfg.train.optm_lr:g} is too high for the toy method; set it <= 0.1."
        )


def warnings(cfg: Config) -> list[str]:
    return sft_warnings(cfg)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    return 0, 0


def plan(cfg: Config) -> StepPlan:
    return sft_plan(cfg)


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    return TrainedWork(levels=plan(cfg).levels, rows=1)
