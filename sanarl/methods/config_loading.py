"""Config loading with every method's checks: the config loader (sanarl/config/loader.py) handed the method
registry's table.

The loader knows no method; these are the entry points the commands, the bench, evaluation, the tools and the tests
load with. The table is read at each call (`registry.METHODS`), so a method added to it is accepted at once. No
torch: the registry imports each method's config.py only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sanarl.config import loader
from sanarl.config.loader import LoadedConfig
from sanarl.config.schema import Config
from sanarl.methods import registry


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """`sanarl.config.loader.load_config` against the registry's methods."""
    return loader.load_config(path, overrides, methods=registry.METHODS)


def loads_config(text: str, overrides: Sequence[str] = (), source: str | Path = "<string>") -> LoadedConfig:
    """`sanarl.config.loader.loads_config` against the registry's methods."""
    return loader.loads_config(text, overrides, source, methods=registry.METHODS)


def check_config(cfg: Config) -> list[str]:
    """`sanarl.config.loader.check_config` against the registry's methods: the checks a loaded config passed, for
    one built in code. Returns the warnings."""
    return loader.check_config(cfg, registry.METHODS)
