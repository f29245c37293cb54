"""Test plugin: the squares dataset (large) that records which indices this process reads."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from squares import Squares  # noqa: E402

READ: list[int] = []


class RecordingSquares(Squares):
    def __getitem__(self, i: int) -> dict:
        READ.append(int(i))
        return super().__getitem__(i)


def get_dataset(config):
    return RecordingSquares(config.policy.diffusers.inference_size[0], n=4096)
