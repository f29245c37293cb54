"""Building a tiny model on first use leaves torch's global generator as it was: the run that builds it (fresh
cache) draws what every later run, which loads it, draws (api.train seeds torch before loading the model, and
LoRA adapters initialise from that stream)."""

from __future__ import annotations

import torch

from sanarl.models.tiny import ensure_tiny_pipeline


def test_first_use_build_keeps_the_global_generator(tmp_path, monkeypatch):
    monkeypatch.setenv("SANARL_CACHE", str(tmp_path / "fresh"))
    torch.manual_seed(1234)
    built_then = (ensure_tiny_pipeline("shapes"), torch.rand(4))  # builds into the fresh cache
    torch.manual_seed(1234)
    loaded_then = (ensure_tiny_pipeline("shapes"), torch.rand(4))  # loads what was built
    assert built_then[0] == loaded_then[0] and (tmp_path / "fresh") in built_then[0].parents
    assert torch.equal(built_then[1], loaded_then[1])
