"""Error types that map to exit codes.

`UserError` (and subclasses) mean bad input: the CLI prints the message (one paragraph naming the key, file or
field and the fix) and exits with code 2, without a traceback unless `--debug`. Anything else is an internal
failure (exit code 1).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: config, plugin, data, paths. Exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A preset or override is invalid (unknown key, wrong type, inconsistent values)."""


class PluginError(UserError):
    """A dataset plugin cannot be resolved or does not honour the contract."""


class DataError(UserError):
    """Dataset files are missing, empty or malformed."""


class WeightsError(UserError):
    """Model weights are not available locally (and the hub cannot be reached)."""
