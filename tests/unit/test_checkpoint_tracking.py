"""Checkpoints (atomic, rotated, resolvable) and run metrics (jsonl, tensorboard, plot)."""

from __future__ import annotations

import json

import pytest
import torch

from sanarl.errors import UserError
from sanarl.training.run_folder.checkpoint_store import (
    list_checkpoints,
    load_checkpoint,
    load_extra,
    resolve_resume,
    save_checkpoint,
)
from sanarl.training.tracking import MetricsLogger, plot_metrics, read_metrics


def save(root, step, value=1.0, max_keep=0):
    tensors = {"model": {"w": torch.full((2, 2), value)}, "ema": {"w": torch.zeros(2)}}
    return save_checkpoint(root, step, tensors, {"optimizer": {"lr": 0.1}}, {"world_size": 1}, max_keep)


def test_round_trip_and_rotation(tmp_path):
    for step in (5, 10, 15):
        save(tmp_path, step, value=step, max_keep=2)
    kept = list_checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step_00000010", "step_00000015"]
    tensors, state, meta = load_checkpoint(kept[-1])
    assert torch.equal(tensors["model"]["w"], torch.full((2, 2), 15.0))
    assert state == {"optimizer": {"lr": 0.1}} and meta["world_size"] == 1 and meta["step"] == 15
    assert set(meta["files"]) == {"model.safetensors", "ema.safetensors", "state.pt"}  # sha256 of each
    assert not list(tmp_path.glob(".staging-*"))


def test_extras_are_written_inside_the_atomic_checkpoint(tmp_path):
    """`extras` land as `<name>.pt` in the same staging directory (weights_only loadable), not as tensor groups."""
    extra = {"steps": [0, 10], "samples": {10: {"images": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)}}}
    path = save_checkpoint(tmp_path, 10, {"model": {"w": torch.ones(1)}}, {}, {}, extras={"guard": extra})
    assert sorted(p.name for p in path.iterdir()) == [
        "guard.pt",
        "meta.json",
        "model.safetensors",
        "state.pt",
    ]
    loaded = load_extra(path, "guard")
    assert loaded["steps"] == [0, 10] and torch.equal(
        loaded["samples"][10]["images"], extra["samples"][10]["images"]
    )
    assert set(load_checkpoint(path)[0]) == {"model"}
    assert load_extra(save(tmp_path, 20), "guard") is None
    assert not list(tmp_path.glob(".staging-*"))


def test_an_unreadable_extra_is_a_user_error_naming_the_file(tmp_path):
    path = save_checkpoint(
        tmp_path, 10, {"model": {"w": torch.ones(1)}}, {}, {}, extras={"guard": {"steps": []}}
    )
    (path / "guard.pt").write_bytes(b"not a torch file")
    with pytest.raises(UserError, match=r"guard\.pt is not a readable checkpoint file.*delete it") as err:
        load_extra(path, "guard")
    assert err.value.exit_code == 2 and str(path / "guard.pt") in str(err.value)


def test_incomplete_checkpoints_are_never_resumed(tmp_path):
    save(tmp_path, 4)
    (tmp_path / "step_00000008").mkdir()  # a kill mid-save could leave this only without the atomic rename
    (tmp_path / ".staging-abc").mkdir()
    assert resolve_resume(True, tmp_path).name == "step_00000004"


def test_resolve_resume_forms(tmp_path):
    assert resolve_resume(False, tmp_path) is None
    assert resolve_resume(True, tmp_path / "none-yet") is None  # first run of a resumable preset starts fresh
    path = save(tmp_path / "run" / "checkpoints", 3)
    assert resolve_resume(str(path), tmp_path) == path
    assert resolve_resume(str(tmp_path / "run"), tmp_path) == path
    with pytest.raises(ValueError, match="holds no checkpoint"):
        resolve_resume(str(tmp_path / "empty"), tmp_path)


def test_metrics_logger_writes_jsonl_tensorboard_and_a_plot(tmp_path):
    logger = MetricsLogger(tmp_path, ["console", "tensorboard"], project="p", experiment="e", config={"a": 1})
    for step in range(1, 4):
        logger.log(step, {"loss": 1.0 / step, "bad": float("nan")})
    logger.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["loss"] for r in records] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert records[0]["bad"] is None
    assert any((tmp_path / "tensorboard").iterdir())
    assert (
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "m.png", ["loss", "absent"]) == tmp_path / "m.png"
    )
    assert plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "n.png", ["absent"]) is None


def test_resumed_logger_appends(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    logger = MetricsLogger(tmp_path, ["console"], project="p", experiment="e", config={}, resume=True)
    logger.log(2, {"loss": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    killed_late = MetricsLogger(tmp_path, ["console"], project="p", experiment="e", config={}, resume=True)
    killed_late.log(
        3, {"loss": 0.5}
    )  # logged after the last checkpoint (step 2), then the process was killed
    MetricsLogger(tmp_path, ["console"], project="p", experiment="e", config={}, resume=True, resume_step=2)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    fresh = MetricsLogger(tmp_path, ["console"], project="p", experiment="e", config={}, resume=False)
    fresh.log(1, {"loss": 3.0})
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [3.0]


def test_the_checksum_is_a_sha256_over_the_sha256_of_each_block(tmp_path, monkeypatch):
    import hashlib
    import os

    from sanarl.training.run_folder import checkpoint_store

    monkeypatch.setattr(checkpoint_store, "BLOCK", 1000)
    data = os.urandom(3500)
    path = tmp_path / "f"
    path.write_bytes(data)
    blocks = [hashlib.sha256(data[i : i + 1000]).digest() for i in range(0, len(data), 1000)]
    assert checkpoint_store.file_sha256(path) == hashlib.sha256(b"".join(blocks)).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert (
        checkpoint_store.file_sha256(tmp_path / "empty")
        == hashlib.sha256(hashlib.sha256(b"").digest()).hexdigest()
    )


def test_recover_root_puts_back_a_checkpoint_moved_aside_and_drops_leftovers(tmp_path):
    from sanarl.training.run_folder.checkpoint_store import recover_root

    save(tmp_path, 4).rename(tmp_path / ".old-step_00000004")  # killed between the two renames
    save(tmp_path, 6)
    (tmp_path / ".old-step_00000006").mkdir()  # killed after the new one was in, before the old was deleted
    (tmp_path / ".staging-x").mkdir()
    (tmp_path / "step_00000008").mkdir()
    notices = recover_root(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000006"]
    assert len(notices) == 3 and "restored" in notices[0]
