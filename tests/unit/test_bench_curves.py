"""The bench's curve arithmetic: training minutes per step from metrics.jsonl, and which checkpoints become
points."""

from __future__ import annotations

import json

from sanarl.bench.curves import curve_overrides, evaluate_intermediate, minutes_at_steps


def _metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_minutes_count_only_the_steps_time(tmp_path):
    rows = [
        {"step": 1, "time_data": 6.0, "time_train": 54.0},
        {"step": 1, "val/x": 1.0},  # a validation record: no step time
        {"step": 2, "time_data": None, "time_train": 30.0},
        {"step": 3, "time_data": 12.0, "time_train": 18.0},
    ]
    _metrics(tmp_path / "metrics.jsonl", rows)
    assert minutes_at_steps(tmp_path / "metrics.jsonl") == {1: 1.0, 2: 1.5, 3: 2.0}


def test_intermediate_checkpoints_become_points_in_step_order(tmp_path):
    _metrics(tmp_path / "metrics.jsonl", [{"step": s, "time_train": 60.0} for s in range(1, 31)])
    for step in (30, 10, 20):
        ckpt = tmp_path / "checkpoints" / f"step_{step:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / "meta.json").write_text("{}")
    seen = []

    def evaluate(ckpt):
        seen.append(ckpt.name)
        return {"scores": {"shapes/strict": {"mean": len(seen) / 10}}}

    points = evaluate_intermediate(tmp_path, 30, evaluate)
    assert seen == ["step_00000010", "step_00000020"]  # the final checkpoint is the run's own record
    assert [(p["step"], p["train_minutes"]) for p in points] == [(10, 10.0), (20, 20.0)]
    assert points[1]["summary"]["scores"]["shapes/strict"]["mean"] == 0.2


def test_curve_overrides_keep_only_timed_checkpoints():
    assert curve_overrides(0.0) == []
    sets = curve_overrides(5.0)
    assert "train.ckpt.save_every_minutes=5.0" in sets and "train.ckpt.max_keep=0" in sets
    assert "train.ckpt.save_freq=1000000000" in sets


def test_paired_gain_averages_seeds_per_sample_then_pairs_with_the_base():
    import math

    from sanarl.bench.report import paired_gain

    base = {"per_sample": {"shapes/strict": [0.0, 1.0, 0.0, 1.0]}}
    seeds = [
        {"per_sample": {"shapes/strict": [1.0, 1.0, 0.0, 1.0]}},
        {"per_sample": {"shapes/strict": [1.0, 0.0, 1.0, 1.0]}},
    ]
    out = paired_gain(seeds, base, "shapes/strict")
    diffs = [1.0, -0.5, 0.5, 0.0]  # per sample: mean over the two seeds minus the base
    mean = sum(diffs) / 4
    stderr = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3) / 2
    assert out["delta"] == mean and math.isclose(out["stderr"], stderr) and out["n"] == 4
    assert math.isnan(
        paired_gain([{}], base, "shapes/strict")["stderr"]
    )  # an older record: no per-sample scores
