"""Typed configuration: the schema, TOML loading with `--set` overrides and checks, and dataset-plugin resolution.

Precedence: `--set` overrides > preset file > schema defaults. The loader (`loader.py`) is handed the method
table it checks against; `sanarl.methods.config_loading` has `load_config` / `loads_config` / `check_config` with the
method registry's table.
"""

from __future__ import annotations

from sanarl.config.dataset_plugins import (
    DatasetPlugin,
    LoadedPlugin,
    builtin_plugins,
    check_plugin,
    load_plugin,
    plugin_label,
    resolve_plugin,
)
from sanarl.config.loader import LoadedConfig, apply_overrides, config_to_dict, dump_toml
from sanarl.config.schema import (
    ALIASES,
    IGNORED_KEYS,
    CkptConfig,
    Config,
    DatasetConfig,
    DiffusersConfig,
    LoggingConfig,
    LoraConfig,
    PolicyConfig,
    RemoteRewardConfig,
    RewardFnConfig,
    RolloutConfig,
    SampleConfig,
    TrainConfig,
    TrainPolicyConfig,
    ValidationConfig,
)

__all__ = [
    "ALIASES",
    "IGNORED_KEYS",
    "CkptConfig",
    "Config",
    "DatasetConfig",
    "DiffusersConfig",
    "LoadedConfig",
    "LoggingConfig",
    "LoraConfig",
    "PolicyConfig",
    "RemoteRewardConfig",
    "RewardFnConfig",
    "RolloutConfig",
    "SampleConfig",
    "TrainConfig",
    "TrainPolicyConfig",
    "ValidationConfig",
    "apply_overrides",
    "builtin_plugins",
    "check_plugin",
    "DatasetPlugin",
    "LoadedPlugin",
    "load_plugin",
    "config_to_dict",
    "dump_toml",
    "plugin_label",
    "resolve_plugin",
]
