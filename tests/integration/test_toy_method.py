"""Adding a method is one folder plus one registry entry (docs/architecture.md, "Adding a method"): the toy method
of tests/data/toy_method/ gets its `Method(...)` entry here and then runs through the front door — the config
loader accepts its trainer type and runs its checks, `sanarl validate` plans it (the memory plan included), and
`sanarl` trains it — with no other table touched."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sanarl.methods import registry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from toy_method import config as toy  # noqa: E402

SHAPES = "sanarl.datasets.shapes"
TOY = registry.Method(
    name="toy", policy_type="sft", trainer_type="toy", task="toy_method.task:ToyTask", view=toy.view,
    validate=toy.validate, warnings=toy.warnings, rollout_cost=toy.rollout_cost, plan=toy.plan,
    trained_work=toy.trained_work,
)  # fmt: skip


@pytest.fixture
def toy_registered(monkeypatch):
    """The one registry entry: the config loader, the CLI, the capacity plan and the trainer all read that table."""
    monkeypatch.setattr(registry, "METHODS", (*registry.METHODS, TOY))


def _args(out: Path, trainer_type: str, *extra: str) -> list[str]:
    return [
        "--config", "tiny-shapes-sft", SHAPES,
        "--set", f"train.output_dir={out}", "--set", f"train.train_policy.trainer_type={trainer_type}",
        "--set", "train.max_num_steps=1", "--set", "validation.enable=false", *extra,
    ]  # fmt: skip


def test_a_toy_method_is_one_folder_plus_one_registry_entry(run_cli, tmp_path, toy_registered):
    code, out, err = run_cli("validate", *_args(tmp_path / "plan", "toy"), "--gpus", "1", "--gpu", "h100")
    assert code == 0, err
    assert "valid" in out + err and "h100" in (out + err).lower()
    code, _, err = run_cli(*_args(tmp_path / "toy", "toy"))
    assert code == 0, err
    code, _, err = run_cli(*_args(tmp_path / "sft", ""))
    assert code == 0, err
    toy_loss, sft_loss = (
        json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])["loss"]
        for name in ("toy", "sft")
    )
    # the same data and noise (pure functions of seed and step): the toy loss is SFT's times its scale
    assert toy_loss == pytest.approx(toy.LOSS_SCALE * sft_loss, rel=1e-6)
    # its own checks run at load, before any model
    code, _, err = run_cli(*_args(tmp_path / "bad", "toy", "--set", "train.optm_lr=0.5"))
    assert code == 2 and "too high for the toy method" in " ".join(err.split()), err
    assert not (tmp_path / "bad").exists()


def test_without_its_entry_the_trainer_type_is_refused_naming_the_ones_there_are(run_cli, tmp_path):
    code, _, err = run_cli(*_args(tmp_path / "run", "toy"))
    message = " ".join(err.split())
    assert code == 2 and "trainer_type" in message and "'toy'" in message, err
