"""Fixture: a dataset plugin without the required `get_dataset` factory."""

from __future__ import annotations


def get_val_dataset(config):
    return ["val"]
