"""Checks of the data against the configured rewards, before any model loads (`sanarl validate`, the start of a
run, `sanarl eval`): a reward that cannot score a prompt (`Reward.check_prompt`, e.g. `shapes` on a caption outside
its grammar) stops the command with a DataError naming the first such prompt, never a failure after loading.

Only rewards that define `check_prompt` read the data, so other runs pay nothing. The trained rewards are checked
against the training items, `validation.held_out_rewards` against the validation items the runner scores.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sanarl.config.schema import Config
from sanarl.errors import DataError
from sanarl.rewards.base import Reward, RewardInputError
from sanarl.rewards.registry import build_reward

MAX_CHECKED_ITEMS = 4096
"""Training items read at most (a procedural or very large set is checked on its first items; a later bad item
still fails cleanly when it is scored, RewardInputError -> exit code 2)."""


def _checking(rewards: Iterable[Reward]) -> list[Reward]:
    return [r for r in rewards if type(r).check_prompt is not Reward.check_prompt]


def _trained_rewards(cfg: Config) -> list[Reward]:
    tp = cfg.train.train_policy
    if (
        tp.type != "grpo" or tp.use_remote_reward
    ):  # SFT / SOAR train on no reward; remote names: the service's
        return []
    return _checking(build_reward(fn.name, **fn.options) for fn in tp.remote_reward.reward_fns)


def _held_out_rewards(cfg: Config) -> list[Reward]:
    return _checking(build_reward(name) for name in cfg.validation.held_out_rewards)


def check_items(rewards: Sequence[Reward], items: Iterable[Mapping[str, Any]], what: str) -> None:
    """Run every reward's `check_prompt` over `items` (`{"prompt", "metadata"?}`); the first refusal is raised
    as a RewardInputError (a DataError) that says which data it came from."""
    for index, item in enumerate(items):
        for reward in rewards:
            try:
                reward.check_prompt(item["prompt"], dict(item.get("metadata") or {}))
            except DataError as exc:
                raise RewardInputError(f"{what}, item {index}: {exc}") from exc


def _items(dataset: Any, count: int) -> Iterable[Mapping[str, Any]]:
    return (dataset[i] for i in range(min(count, len(dataset))))


def check_reward_prompts(cfg: Config, plugin: Any) -> None:
    """Check the plugin's data against the configured rewards (see the module docstring)."""
    trained, held_out = _trained_rewards(cfg), _held_out_rewards(cfg)
    if not trained and not held_out:
        return
    train_set = plugin.get_dataset(cfg)
    if trained:
        check_items(trained, _items(train_set, MAX_CHECKED_ITEMS), "training data")
    if held_out:
        val_set = plugin.get_val_dataset(cfg) if hasattr(plugin, "get_val_dataset") else None
        dataset = val_set if val_set is not None else train_set
        check_items(
            held_out, _items(dataset, cfg.validation.num_samples), "validation data (held_out_rewards)"
        )
