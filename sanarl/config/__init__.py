"""Typed configuration: the schema, TOML loading with `--set` overrides and checks, and dataset-plugin resolution.

Precedence: `--set` overrides > preset file > schema defaults.
"""

from __future__ import annotations

from sanarl.config.loader import (
    LoadedConfig,
    apply_overrides,
    check_config,
    config_to_dict,
    dump_toml,
    load_config,
    loads_config,
)
from sanarl.config.plugins import (
    DatasetPlugin,
    LoadedPlugin,
    builtin_plugins,
    check_plugin,
    load_plugin,
    plugin_label,
    resolve_plugin,
)
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
    "check_config",
    "check_plugin",
    "DatasetPlugin",
    "LoadedPlugin",
    "load_plugin",
    "config_to_dict",
    "dump_toml",
    "load_config",
    "loads_config",
    "plugin_label",
    "resolve_plugin",
]
