"""`[validation.guard]`, the reward-hacking alarm's config section (sanarl/training/guard.py; docs/shapes.md,
"Reward-hacking alarm"), kept beside the schema whose `ValidationConfig.guard` it is (sanarl.config.schema
re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, get_args

from sanarl.config.choices import GuardAction, GuardRollback, GuardWorse
from sanarl.config.ranges import AtLeast
from sanarl.errors import ConfigError

GUARD_WORSE = get_args(GuardWorse)
"""`worse` of a guard metric: the direction in which it worsens."""
GUARD_ACTIONS = get_args(GuardAction)
"""`action` of the guard: log the alarm and go on, or stop the run and export the best checkpoint by the guard."""
GUARD_IMAGE_STATS = ("brightness", "saturation", "entropy", "colour_shift")
"""Image statistics of the validation samples the guard can watch as `heldout/image/<name>`."""


@dataclass
class GuardMetricConfig:
    """`[[validation.guard.metrics]]`: one guard metric, read at every validation."""

    key: str = ""
    """`heldout/<reward>/<key>` (a `validation.held_out_rewards` reward's key, e.g. `heldout/shapes/extra`: objects
    beyond the prompt's count) or `heldout/image/<stat>` (`GUARD_IMAGE_STATS`: mean luma / HSV saturation / colour-histogram entropy in bits / colour shift, the total
    variation distance of the hue histogram from the run's first validation, 0..1)."""
    worse: GuardWorse = "higher"
    """The direction in which the metric worsens."""
    margin: Annotated[float, AtLeast(0)] = 0.0
    """Alarm when the metric is worse than its best validation value by more than this (metric units)."""


@dataclass
class GuardConfig:
    """`[validation.guard]`: the reward-hacking alarm (fires when a guard metric worsens by more than its margin
    while the trained reward rises; see sanarl/training/guard.py)."""

    enable: bool = False
    """Turn the reward-hacking alarm on (needs `metrics` and `validation.held_out_rewards`)."""
    metrics: list[GuardMetricConfig] = field(default_factory=list)
    trained_metric: str = "reward/mean"
    """Per-step metric of the trained reward (mean over the steps since the previous validation); "" = fire on the
    guard metrics alone."""
    min_trained_rise: float = 0.0
    """The trained reward "rises" when it exceeds its value at the guard's best validation by more than this."""
    action: GuardAction = "log"
    """log: record the alarm and grids, go on; stop: stop at that validation and export a kept checkpoint
    (`rollback`), exit code 0."""
    rollback: GuardRollback = "best"
    """What a stopped run exports. best: the validation where the alarm's metric was best (for an image rule often
    the base itself); last_clean: the newest validation at which no guard metric was worse than its best so far by
    more than its margin (the most training that passed every rule; the guard keeps its checkpoint too)."""

    def check(self, validation_enabled: bool, held_out_rewards: list[str]) -> None:
        """Raise ConfigError naming the key and the fix on an invalid guard, given `validation.enable` and
        `validation.held_out_rewards` (the schema's section holds this one; it passes them, so the guard's schema
        imports nothing of it). `action` and `worse` are checked from their types by the config engine, even while
        the guard is off, so a typo does not wait for the run that turns it on."""
        where = "validation.guard"
        if not self.enable:
            return
        if not validation_enabled:
            raise ConfigError(
                f"`{where}.enable` = true needs `validation.enable = true` (the guard reads validations)."
            )
        if not self.metrics:
            raise ConfigError(
                f"`{where}.enable` = true with no `[[{where}.metrics]]`; add one, e.g. "
                '`metrics = [{ key = "heldout/shapes/extra", worse = "higher", margin = 0.3 }]`.'
            )
        for i, m in enumerate(self.metrics):
            self._check_metric(m, f"{where}.metrics[{i}]", held_out_rewards)

    @staticmethod
    def _check_metric(m: GuardMetricConfig, where: str, held_out: list[str]) -> None:
        parts = m.key.split("/")
        ok = len(parts) >= 3 and parts[0] == "heldout" and all(parts)
        if ok and parts[1] == "image":
            ok = len(parts) == 3 and parts[2] in GUARD_IMAGE_STATS
        elif ok and parts[1] not in held_out:
            raise ConfigError(
                f"`{where}.key` = {m.key!r} reads reward {parts[1]!r}, which `validation.held_out_rewards` = "
                f"{held_out} does not score; add it there."
            )
        if not ok:
            raise ConfigError(
                f"`{where}.key` = {m.key!r} is not a guard metric; use `heldout/<reward>/<key>` (a reward of "
                f"`validation.held_out_rewards`) or `heldout/image/<stat>` with stat one of {GUARD_IMAGE_STATS}."
            )
