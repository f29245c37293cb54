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


class RunStopped(Exception):
    """A run stopped on purpose before its end (not bad input): the CLI prints the message and exits with
    `exit_code`, without a traceback."""

    exit_code = 1


class Interrupted(RunStopped):
    """SIGINT (exit 130) or SIGTERM (exit 143) stopped the run at a step boundary, after a final checkpoint."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class RewardsFailed(RunStopped):
    """The rewards could not score a step (every sample non-finite, a reward or its endpoint failing, the reward
    service failing a task or unreachable past its retries): the run stops before training on it. Exit code 3."""

    exit_code = 3


class Diverged(RunStopped):
    """The loss, the gradients or the weights became non-finite: the run stops before any checkpoint or export
    holds them. Exit code 3."""

    exit_code = 3
