"""Checks of the configured rewards before any model loads: their names and options (`check_reward_names`), and the
data against them (`sanarl validate`, the start of a run, `sanarl eval`): a reward that cannot score a prompt (`Reward.check_prompt`, e.g. `shapes` on a caption outside
its grammar) stops the command with a DataError naming the first such prompt, never a failure after loading.

Only rewards that define `check_prompt` read the data, so other runs pay nothing. The trained rewards are checked
against the training items, `validation.held_out_rewards` against the validation items the runner scores.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sanarl.config.cosmos.drop_in import reward_lines
from sanarl.config.schema import Config
from sanarl.errors import ConfigError, DataError
from sanarl.rewards.base import Reward, RewardInputError
from sanarl.rewards.registry import build_reward, known_rewards, resolve_score_key

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


def check_reward_names(cfg: Config) -> list[str]:
    """Each reward of the run is scored in-process (its name is in the registry, it builds with its options and
    returns its `score_key`) or
    on the reward service (the registry's names, or Cosmos-RL's service names, see `drop_in.reward_lines`);
    anything else fails here, before weights load (the service itself is asked by
    `sanarl.training.preflight`). Returns the lines to print."""
    tp = cfg.train.train_policy
    remote = tp.use_remote_reward
    fns = tp.remote_reward.reward_fns
    try:
        lines = reward_lines([fn.name for fn in fns], remote, known_rewards())
    except ValueError as err:
        raise ConfigError(
            f"{err}. (`train.train_policy.remote_reward.reward_fns`; docs/cosmos-rl.md)"
        ) from None
    for index, fn in enumerate(fns):
        # ConfigError for an unknown name (listing the known ones), options the reward does not take or a
        # score_key it does not return (building a reward loads no weights; the service checks its own keys)
        if not remote and (fn.name not in known_rewards() or fn.options or fn.score_key):
            resolve_score_key(index, fn.name, fn.score_key, build_reward(fn.name, **fn.options))
    for name in cfg.validation.held_out_rewards:
        if name not in known_rewards():
            build_reward(name)
    return lines
