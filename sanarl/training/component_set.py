"""The components a run composes (sanarl/training/component_hooks.py), in calling order: sanarl's own, then the
user's of `train.components` (sanarl/config/user_components.py)."""

from __future__ import annotations

import re
from pathlib import Path

from sanarl.config.schema import Config
from sanarl.config.user_components import FACTORY, component_factory
from sanarl.errors import ConfigError
from sanarl.training.component_hooks import RunComponent, RunHandle
from sanarl.training.guard_run import GuardComponent

_NAME = re.compile(r"[A-Za-z0-9_-]+")
RESERVED_NAMES = frozenset({"state"})
"""Stems a component may not take: a checkpoint's own `state.pt`."""


def build_components(cfg: Config, run: RunHandle, run_dir: Path, held_out_rewards) -> list[RunComponent]:
    """The run's components in calling order: the reward-hacking guard of `[validation.guard]` (when on), then each
    of `train.components` whose `build_component` returns one. `held_out_rewards()` builds (once) the rewards of
    `validation.held_out_rewards`."""
    built = [GuardComponent.build(cfg, run, run_dir, held_out_rewards)]
    for index, module in enumerate(cfg.train.components):
        built.append(user_component(cfg, run, run_dir, f"train.components[{index}]", module))
    components = [component for component in built if component is not None]
    check_names(components)
    return components


def user_component(cfg: Config, run: RunHandle, run_dir: Path, key: str, module: str) -> RunComponent | None:
    """What `build_component` of `module` (config key `key`) returns for this run; ConfigError unless it is a
    RunComponent or None."""
    component = component_factory(module, key)(cfg, run, run_dir)
    if component is not None and not isinstance(component, RunComponent):
        raise ConfigError(
            f"`{key}` = {module!r}: `{FACTORY}` returned {type(component).__name__}, not a RunComponent or None; "
            "derive the component from sanarl.training.component_hooks.RunComponent (every hook does nothing "
            'until overridden); see docs/architecture.md, "Run components".'
        )
    return component


def check_names(components: list[RunComponent]) -> None:
    """Each component's `name` (its checkpoint file's stem, `<name>.pt`) is a word of its own: ConfigError naming the
    component otherwise."""
    seen: set[str] = set()
    for component in components:
        label = f"run component {type(component).__module__}.{type(component).__qualname__}"
        if not _NAME.fullmatch(component.name) or component.name in RESERVED_NAMES:
            raise ConfigError(
                f"{label} has name {component.name!r}; set its class attribute `name` to a word of letters, "
                f"digits, `_` or `-` other than {sorted(RESERVED_NAMES)} (its state is saved as `<name>.pt`)."
            )
        if component.name in seen:
            raise ConfigError(
                f"{label} has name {component.name!r}, which another component of this run has; give each "
                "component a name of its own (its state is saved as `<name>.pt`)."
            )
        seen.add(component.name)
