"""The bases of the methods' tasks: `CheckedTask`, the training protocol's `Task` whose constructor first runs the
loader's own `check_config` (so a config built in code meets the rules and messages of a config read from a file),
and `ItemTask`, which also reads the plugin's training items."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.schema import Config
from sanarl.datasets.common import collate as default_collate
from sanarl.methods.config_loading import check_config
from sanarl.models.base import DiffusionAdapter
from sanarl.training.protocol import Task, load_train_dataset


class CheckedTask(Task):
    """A `Task` built from a checked config (ConfigError naming the key and the fix before anything is built), with
    the method's view of it."""

    view: Any
    """What the method reads of the config (its config.py's view; a subclass declares its type)."""
    method_view: Callable[[Config], Any]
    """The method's view function (its config.py `view`), set as `staticmethod(view)`."""

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        check_config(cfg)
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        self.view = self.method_view(cfg)


class ItemTask(CheckedTask):
    """A task that trains on the plugin's items (SFT, SOAR): its train dataset, read once, and the plugin's collate
    (the default stacks tensors and lists the rest)."""

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        self.train_dataset = load_train_dataset(cfg, plugin)
        self.collate = getattr(plugin, "collate", default_collate)
