"""Rewards by name: `build_reward("jpeg_compressibility")` -> a `Reward`.

Two kinds of entries, one namespace:
- lazy entries, `"module:attribute"` strings imported on first use, so that importing this registry never imports
  a reward's dependencies (torchvision, open_clip, ...). Every shipped reward is lazy (`_BUILTIN`); heavy rewards
  add one line there, with the pip extra that provides their packages.
- eager entries from the `@register(name)` decorator (a Reward subclass or a factory returning a Reward), e.g. in a
  user's dataset plugin.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from sanarl.errors import ConfigError, PluginError
from sanarl.rewards.base import Reward

ENTRY_KEY = "train.train_policy.remote_reward.reward_fns"
"""The config key whose `name` fields are looked up here (used in error messages)."""

IMAGEREWARD_INSTALL = (
    "pip install timm && pip install --no-deps image-reward==1.5 && pip install --no-deps --no-build-isolation "
    "fairscale==0.4.13 (bash scripts/install_imagereward.sh in a checkout; docs/rewards.md)"
)
"""image-reward pins timm 0.6.13 and an old diffusers, so it goes in without its pins (no sanarl extra can)."""

_BUILTIN: dict[str, tuple[str, str]] = {
    "jpeg_compressibility": ("sanarl.rewards.scorers.jpeg:JpegCompressibility", ""),
    "jpeg_incompressibility": ("sanarl.rewards.scorers.jpeg:JpegIncompressibility", ""),
    "shapes": ("sanarl.rewards.scorers.shapes:ShapesReward", ""),
    "pickscore": ("sanarl.rewards.scorers.pickscore:PickScore", "pip install 'sanarl[rewards]'"),
    "clipscore": ("sanarl.rewards.scorers.clipscore:ClipScore", "pip install 'sanarl[rewards]'"),
    "aesthetic": ("sanarl.rewards.scorers.aesthetic:Aesthetic", "pip install 'sanarl[rewards]'"),
    "hpsv2": ("sanarl.rewards.scorers.hpsv2:HPSv2", "pip install 'sanarl[rewards]'"),
    "imagereward": ("sanarl.rewards.scorers.imagereward:ImageReward", IMAGEREWARD_INSTALL),
    "ocr": ("sanarl.rewards.scorers.ocr:OCRReward", "pip install 'sanarl[ocr]'"),
    "geneval": ("sanarl.rewards.scorers.geneval:GenEvalReward", "pip install 'sanarl[geneval]'"),
    "motion": ("sanarl.rewards.scorers.motion:MotionReward", ""),
    "dance_grpo": ("sanarl.rewards.scorers.vlm.videoalign:VideoAlign", "pip install 'sanarl[vlm]'"),
    "videoalign": ("sanarl.rewards.scorers.vlm.videoalign:VideoAlignAlias", "pip install 'sanarl[vlm]'"),
    "cosmos_reason1": ("sanarl.rewards.scorers.vlm.reason1:CosmosReason1", "pip install 'sanarl[vlm]'"),
    "hpsv3": ("sanarl.rewards.scorers.vlm.hpsv3:HPSv3", "pip install 'sanarl[vlm]'"),
    "unified_reward": ("sanarl.rewards.scorers.vlm.unified:UnifiedReward", "pip install 'sanarl[vlm]'"),
}
"""Shipped rewards: name -> ("module:attribute", install hint for its optional packages)."""

Factory = Callable[..., Reward]
F = TypeVar("F", bound=Callable[..., Reward])

_lock = threading.RLock()
_eager: dict[str, Factory] = {}
_lazy: dict[str, tuple[str, str]] = dict(_BUILTIN)


def register(name: str) -> Callable[[F], F]:
    """Decorator registering a Reward subclass (or a factory `(**options) -> Reward`) under `name`.

    Registering the same object twice is a no-op; another object under a taken name raises ValueError. A lazy entry
    whose module defines the decorated object is replaced by it (so a lazily imported module may self-register).
    """

    def decorate(factory: F) -> F:
        with _lock:
            current = _eager.get(name)
            if current is not None and current is not factory:
                raise ValueError(
                    f"reward name {name!r} is already registered to {current!r}; pick another name."
                )
            if name in _lazy and _lazy[name][0].split(":")[0] != getattr(factory, "__module__", None):
                raise ValueError(f"reward name {name!r} is already registered lazily to {_lazy[name][0]!r}.")
            _lazy.pop(name, None)
            _eager[name] = factory
        return factory

    return decorate


def register_lazy(name: str, target: str, install_hint: str = "") -> None:
    """Register `name` to `"package.module:attribute"`, imported only when the reward is built.

    `install_hint` (e.g. `pip install 'sanarl[rewards]'`) is shown when the module's dependencies are missing.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"lazy reward target {target!r} must look like 'package.module:attribute'.")
    with _lock:
        if name in _eager or (name in _lazy and _lazy[name][0] != target):
            raise ValueError(f"reward name {name!r} is already registered; pick another name.")
        _lazy[name] = (target, install_hint)


def unregister(name: str) -> None:
    """Remove a registered reward (tests and plugin reloads); unknown names are ignored."""
    with _lock:
        _eager.pop(name, None)
        _lazy.pop(name, None)


def known_rewards() -> list[str]:
    """Sorted names of every registered reward (eager and lazy); listing imports nothing."""
    with _lock:
        return sorted({*_eager, *_lazy})


def resolve_score_key(index: int, name: str, score_key: str, reward: Reward) -> str:
    """The key entry `index` of `ENTRY_KEY` reads from `reward`: `score_key`, or the reward's default key when
    empty; a key the reward does not return is a ConfigError listing the ones it does."""
    key = score_key or reward.default_key
    if key not in reward.keys:
        raise ConfigError(
            f"`{ENTRY_KEY}[{index}]` (name = {name!r}) has score_key = {key!r}, which reward {name!r} does not "
            f"return; available keys: {list(reward.keys)}. Set score_key to one of them (empty = "
            f"{reward.default_key!r})."
        )
    return key


def _unknown(name: Any) -> ConfigError:
    known = known_rewards()
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"`{ENTRY_KEY}` entry `name = {name!r}` is not a known reward.{hint} Known rewards: {', '.join(known)}. "
        "Fix the name, or register your own reward with `@sanarl.rewards.register(name)` in your plugin."
    )


def _import_lazy(name: str, target: str, install_hint: str) -> Factory:
    """Import a lazy entry; a missing third-party package becomes a ConfigError with the install hint."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing == module_name or missing.split(".")[0] == "sanarl":
            raise PluginError(f"reward {name!r} points at {target!r}, whose module does not exist.") from exc
        how = install_hint or f"pip install {missing.split('.')[0]}"
        raise ConfigError(
            f"`{ENTRY_KEY}` entry `name = {name!r}` needs the Python package {missing!r}, which is not installed; "
            f"install it ({how}) or remove this reward from the config."
        ) from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise PluginError(
            f"reward {name!r} points at {target!r}, but {module_name} has no callable {attr!r}."
        )
    return factory


def _factory(name: str) -> Factory:
    with _lock:
        if name in _eager:
            return _eager[name]
        if name not in _lazy:
            raise _unknown(name)
        target, hint = _lazy[name]
        factory = _import_lazy(name, target, hint)
        if name in _lazy:  # the module did not self-register: cache the resolved attribute
            _lazy.pop(name)
            _eager[name] = factory
        return _eager[name]


def build_reward(name: str, **options: Any) -> Reward:
    """A new instance of the reward registered as `name`, built with keyword `options`.

    Raises ConfigError for an unknown name (listing the known ones), options the reward does not take, or missing
    optional packages; PluginError when a registered factory does not produce a `Reward`.
    """
    if not isinstance(name, str) or not name.strip():
        raise _unknown(name)
    factory = _factory(name)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise ConfigError(
            f"reward {name!r} does not accept the options {sorted(options)} ({exc}); its signature is "
            f"{name}{inspect.signature(factory)}."
        ) from exc
    reward = factory(**options)
    if not isinstance(reward, Reward):
        raise PluginError(
            f"reward {name!r} was built by {factory!r} as a {type(reward).__name__}, not a sanarl.rewards.Reward; "
            "subclass Reward and implement _score."
        )
    return reward
