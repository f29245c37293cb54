"""Turning `[[reward_args]]` into `Reward` objects: plugin imports, `build_reward`, model loading.

The CLI calls `build_rewards(config, load=False)` before starting anything, so a wrong name or option (or
missing weights, for rewards with a `check_weights()` hook) stops the service with a UserError naming the entry;
each worker then calls it with `load=True` (models load once per worker process, on the entry's device).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from reward_service.config import ServiceConfig
from sanarl.errors import ConfigError, PluginError, UserError
from sanarl.rewards.base import Reward
from sanarl.rewards.registry import build_reward


def import_plugins(config: ServiceConfig) -> None:
    """Import every `plugins` entry (a dotted module, or a .py file relative to the working directory)."""
    for i, spec in enumerate(config.plugins):
        where = f"{config.source}: `plugins[{i}]` = {spec!r}"
        try:
            if spec.endswith(".py") or "/" in spec:
                _import_file(Path(spec).expanduser().resolve(), where)
            else:
                importlib.import_module(spec)
        except UserError:
            raise
        except ModuleNotFoundError as exc:
            raise PluginError(
                f"{where} cannot be imported ({exc}); fix the name or install the package."
            ) from exc
        except Exception as exc:
            raise PluginError(f"{where} raised while importing: {type(exc).__name__}: {exc}") from exc


def _import_file(path: Path, where: str) -> None:
    if not path.is_file():
        raise PluginError(f"{where}: no such file ({path}); paths are relative to the working directory.")
    name = f"sanarl_reward_plugin_{abs(hash(str(path)))}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def build_rewards(
    config: ServiceConfig, load: bool, names: list[str] | None = None, device: str = ""
) -> dict[str, Reward]:
    """One Reward per enabled `[[reward_args]]` entry (only `names`, when given); `load` also loads its model on
    `device`, or on the entry's own device when `device` is empty."""
    import_plugins(config)
    rewards: dict[str, Reward] = {}
    for i, entry in enumerate(config.reward_args):
        if not entry.enable or (names is not None and entry.reward_type not in names):
            continue
        where = f"{config.source}: `reward_args[{i}]` (reward_type = {entry.reward_type!r})"
        try:
            reward = build_reward(entry.reward_type, **entry.build_options())
        except UserError as exc:
            raise type(exc)(f"{where}: {exc}") from exc
        if load:
            _load(reward, device or entry.device, where)
        else:
            _check_weights(reward, where)
        rewards[entry.reward_type] = reward
    return rewards


def _check_weights(reward: Reward, where: str) -> None:
    """Rewards with a `check_weights()` hook (e.g. the VLM rewards) find missing weights here, before any worker
    loads a model, so the service stops at start (exit code 2) instead of serving without them."""
    check = getattr(reward, "check_weights", None)
    if check is None:
        return
    try:
        check()
    except UserError as exc:
        raise type(exc)(f"{where}: {exc}") from exc


def _load(reward: Reward, device: str, where: str) -> None:
    try:
        reward.setup(device)
    except UserError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    except (RuntimeError, AssertionError) as exc:
        raise ConfigError(f"{where}: cannot place the reward on device {device!r}: {exc}") from exc


def reward_info(reward: Reward) -> dict[str, Any]:
    """What /health and clients learn about a reward: its keys and default key."""
    return {"keys": list(reward.keys), "default_key": reward.default_key}
