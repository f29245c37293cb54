"""The reward-hacking alarm in a real run: a tiny DiffusionNFT run whose guard fires at the first validation after
training starts, stops, and exports the best checkpoint by the guard (rollback), exit code 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "nft-tiny.toml"

# Brightness watched both ways with margin 0 and no trained-reward condition: any change of the validation samples'
# mean brightness after the first step fires one of the two rules, so the alarm is deterministic on every machine.
GUARD = (
    "validation.enable=true", "validation.val_before_train=true", "validation.freq=1", "validation.num_samples=4",
    "validation.batch_size=4", 'validation.held_out_rewards=["shapes"]', "validation.guard.enable=true",
    'validation.guard.action="stop"', 'validation.guard.trained_metric=""',
    'validation.guard.metrics=[{key="heldout/image/brightness", worse="higher", margin=0.0}, '
    '{key="heldout/image/brightness", worse="lower", margin=0.0}, {key="heldout/shapes/extra", margin=100.0}]',
)  # fmt: skip


def test_guard_stops_the_run_and_exports_the_best_checkpoint(run_cli, tmp_path):
    code, stdout, stderr = run_cli(
        "--config", PRESET, "sanarl.datasets.shapes", "--set", f"train.output_dir={tmp_path}",
        "--set", "train.max_num_steps=4", *[x for s in GUARD for x in ("--set", s)],
    )  # fmt: skip
    assert code == 0, stderr
    assert "stopped by the reward-hacking guard at step 1" in stdout
    assert "Exported the step-0 weights (best by the guard)" in stdout
    (alarm,) = json.loads((tmp_path / "guard" / "alarm.json").read_text())
    assert (alarm["key"], alarm["best_step"], alarm["step"]) == ("heldout/image/brightness", 0, 1)
    assert (tmp_path / "guard" / "alarm_step_00000001.png").is_file()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert max(r["step"] for r in records) == 1  # stopped after the first step, not at max_num_steps = 4
    assert [r["guard/alarm"] for r in records if "guard/alarm" in r] == [0.0, 1.0]
    assert any("heldout/shapes/exact" in r and "heldout/image/saturation" in r for r in records)
    # the last checkpoint is the trained state; the export is the guard's best (step 0) EMA weights
    best = load_file(tmp_path / "guard" / "step_00000000" / "ema.safetensors")
    last = load_file(tmp_path / "checkpoints" / "step_00000001" / "ema.safetensors")
    exported = load_file(tmp_path / "export" / "pytorch_lora_weights.safetensors")
    assert any(not torch.equal(best[k], last[k]) for k in best)
    assert len(exported) == len(best)
    for key, value in best.items():  # diffusers LoRA names: "transformer." prefix, no adapter name
        assert torch.equal(exported["transformer." + key.replace(".default.", ".")].to(value.dtype), value), (
            key
        )
