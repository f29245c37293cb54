"""The reward-hacking alarm in a real run: a tiny DiffusionNFT run whose guard fires at the first validation after
training starts, stops, and exports the best checkpoint by the guard (rollback), exit code 0; and a resumed run whose
guard fires against a best validation from before the resume and rolls back to that pre-resume checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sanarl.methods.config_loading import load_config
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
BRIGHTNESS = "heldout/image/brightness"


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


def _expected_alarm(values: dict[int, float], now: int) -> tuple[int, bool]:
    """(best step, fires) of GUARD's rules at validation `now` from their definition: "higher" is worse first (best
    = the lowest so far, earliest on ties), then "lower" is worse (best = the highest); margin 0."""
    before = sorted(s for s in values if s < now)
    low = min(before, key=lambda s: (values[s], s))
    if values[now] > values[low]:
        return low, True
    high = min(before, key=lambda s: (-values[s], s))
    return high, values[now] < values[high]


def test_a_resumed_run_fires_against_the_best_from_before_the_resume_and_rolls_back_to_it(run_cli, tmp_path):
    """Steps 1..2 with validations at 0, 1, 2 and a checkpoint at 2, the guard's margins too wide to fire (100);
    resumed with margin 0 up to 4 steps: the first validation after the resume (step 3) fires against the best of
    validations 0..2, stops, and exports that validation's kept checkpoint. A guard that restarts at the resume (the
    old behaviour) would take step 3 as its first best and fire at step 4 against it."""
    wide = [x.replace("margin=0.0", "margin=100.0") for x in GUARD]
    base = ["--config", PRESET, "sanarl.datasets.shapes", "--set", f"train.output_dir={tmp_path}"]
    code, _, stderr = run_cli(
        *base, "--set", "train.max_num_steps=2", *[x for s in wide for x in ("--set", s)]
    )
    assert code == 0, stderr
    assert not (tmp_path / "guard" / "alarm.json").exists()
    assert (tmp_path / "checkpoints" / "step_00000002" / "guard.pt").is_file()
    kept_before = sorted(p.name for p in (tmp_path / "guard").glob("step_*"))
    resume = ("train.max_num_steps=4", "train.resume=true", *GUARD)

    # a damaged guard.pt fails the checkpoint's checksums: with no other checkpoint the resume stops with exit 2,
    # naming the file, and changes nothing on disk (an unreadable guard.pt of a checkpoint without checksums:
    # tests/unit/test_checkpoint_tracking.py)
    saved = tmp_path / "checkpoints" / "step_00000002" / "guard.pt"
    good, files_before = saved.read_bytes(), sorted(str(p) for p in tmp_path.rglob("*"))
    saved.write_bytes(b"not a torch file")
    code, _, stderr = run_cli(*base, *[x for s in resume for x in ("--set", s)])
    assert code == 2 and f"{saved}doesnotmatchitschecksum" in "".join(stderr.split())
    assert sorted(str(p) for p in tmp_path.rglob("*")) == files_before
    saved.write_bytes(good)

    code, stdout, stderr = run_cli(*base, *[x for s in resume for x in ("--set", s)])
    assert code == 0, stderr
    assert "resumed" in stdout

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]  # steps 1, 2 before the resume, 3 after
    values = {r["step"]: r[BRIGHTNESS] for r in records if BRIGHTNESS in r}
    assert sorted(values) == [0, 1, 2, 3]  # stopped at the first validation after the resume
    best, fires = _expected_alarm(values, 3)
    assert fires and f"step_{best:08d}" in kept_before  # a best from before the resume, kept then
    (alarm,) = json.loads((tmp_path / "guard" / "alarm.json").read_text())
    assert (alarm["key"], alarm["best_step"], alarm["step"]) == (BRIGHTNESS, best, 3)
    assert (alarm["value"], alarm["best"]) == (values[3], values[best])
    assert "stopped by the reward-hacking guard at step 3" in stdout
    assert f"Exported the step-{best} weights (best by the guard)" in stdout
    kept = load_file(tmp_path / "guard" / f"step_{best:08d}" / "ema.safetensors")
    exported = load_file(tmp_path / "export" / "pytorch_lora_weights.safetensors")
    last = load_file(tmp_path / "checkpoints" / "step_00000003" / "ema.safetensors")
    assert any(not torch.equal(kept[k], last[k]) for k in kept)
    for key, value in kept.items():
        assert torch.equal(exported["transformer." + key.replace(".default.", ".")].to(value.dtype), value), (
            key
        )


# The shipped tiny-shapes-nft-exact (tiny-shapes-nft plus the shipped guard) at 10 times its learning rate, with a
# smaller batch and validation: the samples degrade the way the 25-minute run did (specks, textured background,
# colours drifting) within 8 steps instead of 200. Over so few steps the trained reward is noise, so the rise
# condition is off (`trained_metric = ""`; tests/unit/test_guard.py replays the 25-minute curve with it on).
DEGRADING = (
    "train.optm_lr=1e-2", "train.max_num_steps=12", "train.train_batch_per_replica=16",
    "train.train_policy.mini_batch=16", "validation.freq=4", "validation.num_samples=16", "validation.batch_size=16",
    'validation.guard.trained_metric=""',
)  # fmt: skip


def test_the_shipped_guard_stops_a_run_whose_images_degrade_and_rolls_back(run_cli, tmp_path):
    code, stdout, stderr = run_cli(
        "--config", "tiny-shapes-nft-exact", "sanarl.datasets.shapes", "--set", f"train.output_dir={tmp_path}",
        *[x for s in DEGRADING for x in ("--set", s)],
    )  # fmt: skip
    assert code == 0, stderr
    records = read_metrics(tmp_path / "metrics.jsonl")
    held = {r["step"]: r for r in records if "heldout/shapes/specks" in r}
    assert sorted(held) == [0, 4, 8] and max(r["step"] for r in records) == 8  # stopped at 8 of 12 steps
    base, now = held[0], held[8]
    assert base["heldout/shapes/specks"] == 0.0 and base["heldout/image/colour_shift"] == 0.0
    # the images degraded, not the counts: specks per image and the colour entropy far past their margins
    assert now["heldout/shapes/specks"] > 0.25 + 1.0
    assert now["heldout/image/entropy"] > base["heldout/image/entropy"] + 0.5
    (alarm,) = json.loads((tmp_path / "guard" / "alarm.json").read_text())
    assert (alarm["key"], alarm["best_step"], alarm["step"]) == ("heldout/shapes/specks", 0, 8)
    assert alarm["value"] == now["heldout/shapes/specks"] and alarm["action"] == "stop"
    text = " ".join(stdout.split())  # the console wraps long lines
    assert "stopped by the reward-hacking guard at step 8: guard: heldout/shapes/specks worsened" in text
    assert (tmp_path / "guard" / "alarm_step_00000008.png").is_file()
    # the shipped `rollback = "last_clean"`: step 4 is within every margin of its rule's best so far (re-checked from
    # the logged values), so the stop exports step 4's kept checkpoint, not the base (the specks' best)
    rules = load_config(tmp_path / "config.toml").config.validation.guard.metrics
    for rule in rules:
        sign = 1.0 if rule.worse == "higher" else -1.0
        best = min(held[0][rule.key] * sign, held[4][rule.key] * sign)
        assert held[4][rule.key] * sign - best <= rule.margin, rule.key
    assert "Exported the step-4 weights (the newest validation within every margin)" in text
    _assert_exported(tmp_path, 4)


def _assert_exported(run: Path, step: int) -> None:
    """The run's LoRA export holds the guard's kept EMA weights of validation `step`."""
    kept = load_file(run / "guard" / f"step_{step:08d}" / "ema.safetensors")
    exported = load_file(run / "export" / "pytorch_lora_weights.safetensors")
    for key, value in kept.items():  # diffusers LoRA names: "transformer." prefix, no adapter name
        assert torch.equal(exported["transformer." + key.replace(".default.", ".")].to(value.dtype), value), (
            key
        )


def test_best_rollback_exports_the_alarm_metrics_best_validation(run_cli, tmp_path):
    """The same degrading run with `validation.guard.rollback = "best"`: the stop at step 8 exports the specks' best
    validation, the base (step 0)."""
    code, stdout, stderr = run_cli(
        "--config", "tiny-shapes-nft-exact", "sanarl.datasets.shapes", "--set", f"train.output_dir={tmp_path}",
        *[x for s in DEGRADING for x in ("--set", s)], "--set", "validation.guard.rollback=best",
    )  # fmt: skip
    assert code == 0, stderr
    (alarm,) = json.loads((tmp_path / "guard" / "alarm.json").read_text())
    assert (alarm["key"], alarm["best_step"], alarm["step"]) == ("heldout/shapes/specks", 0, 8)
    assert "Exported the step-0 weights (best by the guard)" in " ".join(stdout.split())
    _assert_exported(tmp_path, 0)
