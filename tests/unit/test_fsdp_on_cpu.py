"""`enable_fsdp_on_cpu`: which launches it switches to FSDP2, and the FSDP1 refusal (the switch itself runs in the
2-process FSDP launch of tests/integration/test_multiprocess.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sanarl.errors import ConfigError
from sanarl.training.distributed import enable_fsdp_on_cpu, fsdp_requested


def fake_accelerator(processes: int = 2, device: str = "cpu"):
    return SimpleNamespace(
        device=torch.device(device), num_processes=processes, mixed_precision="no", state=SimpleNamespace()
    )


@pytest.mark.parametrize(("value", "wanted"), [("true", True), ("1", True), ("false", False), (None, False)])
def test_fsdp_requested_reads_the_launch_environment(monkeypatch, value, wanted):
    if value is None:
        monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_USE_FSDP", value)
    assert fsdp_requested() is wanted


@pytest.mark.parametrize(
    ("env", "acc"),
    [
        ({}, fake_accelerator()),  # FSDP not requested
        ({"ACCELERATE_USE_FSDP": "true"}, fake_accelerator(processes=1)),  # one process: nothing to shard
    ],
)
def test_leaves_other_launches_alone(monkeypatch, env, acc):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    enable_fsdp_on_cpu(acc)
    assert vars(acc.state) == {}


def test_fsdp1_on_cpu_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    acc = fake_accelerator()
    with pytest.raises(ConfigError, match="fsdp_version: 2"):
        enable_fsdp_on_cpu(acc)
    assert vars(acc.state) == {}  # nothing switched
