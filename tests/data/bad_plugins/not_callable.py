"""Fixture: a dataset plugin whose `get_dataset` is not a function."""

from __future__ import annotations

get_dataset = 42
