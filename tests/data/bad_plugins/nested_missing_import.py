"""Fixture: a dataset plugin that exists but imports a package that is not installed."""

from __future__ import annotations

import sanarl_missing_dependency_xyz  # noqa: F401


def get_dataset(config):
    return []
