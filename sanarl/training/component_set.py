"""The components a run composes (sanarl/training/component_hooks.py), in calling order."""

from __future__ import annotations

from pathlib import Path

from sanarl.config.schema import Config
from sanarl.training.component_hooks import RunComponent, RunHandle
from sanarl.training.guard_run import GuardComponent


def build_components(cfg: Config, run: RunHandle, run_dir: Path, held_out_rewards) -> list[RunComponent]:
    """The run's components in calling order (today: the reward-hacking guard of `[validation.guard]`, when on).
    `held_out_rewards()` builds (once) the rewards of `validation.held_out_rewards`."""
    built = [GuardComponent.build(cfg, run, run_dir, held_out_rewards)]
    return [component for component in built if component is not None]
