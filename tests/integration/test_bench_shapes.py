"""A shortened `sanarl bench shapes` (tiny budget, 1 seed, 2 methods, 16 eval samples): files, table, resume;
the first run uses two worker processes (`--jobs 2`), the resumed one runs in process."""

from __future__ import annotations

import json

import pytest
from PIL import Image

pytestmark = pytest.mark.slow

SMALL = (
    "--budget-minutes", "0.001", "--seeds", "1", "--methods", "sft-more,soar", "--eval", "16", "--eval-steps", "2",
    "--set", "train.train_batch_per_replica=4", "--set", "train.train_policy.mini_batch=4",
    "--set", "train.train_policy.soar.num_sampling_steps=4",
)  # fmt: skip


def test_short_bench_writes_table_plot_grids_and_resumes(run_cli, tmp_path):
    out = tmp_path / "bench"
    code, stdout, stderr = run_cli("bench", "shapes", *SMALL, "--output", out, "--jobs", "2")
    assert code == 0, stderr
    assert "2 runs, 2 at a time" in stdout  # two worker processes
    results = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in results["methods"]}
    assert list(rows) == ["base", "sft-more", "soar"]
    for method in ("sft-more", "soar"):
        done = json.loads((out / method / "seed0" / "done.json").read_text())
        assert done["steps"] == 1  # the wall budget stops after the first step
        assert rows[method]["strict"] == pytest.approx(done["summary"]["scores"]["shapes/strict"]["mean"])
        assert rows[method]["gain"] == pytest.approx(rows[method]["strict"] - rows["base"]["strict"])
        assert len(done["per_sample"]["shapes/strict"]) == 16  # kept for the paired standard error
        width, height = Image.open(out / "grids" / f"{method}.png").size
        assert (
            width == 8 * 128 and height % 2 == 0 and height // 2 - 128 >= 34
        )  # 2 rows, captions whole below
    assert rows["soar"]["rollout_images"] == 4 and rows["soar"]["reward_calls"] == 0  # 1 step x 4 x 1 path
    assert rows["sft-more"]["rollout_images"] == 0
    assert results["ratios"][0]["what"].startswith("SOAR vs SFT-more")
    assert 0.0 < rows["base"]["background_fraction"] <= 1.0 and rows["base"]["entropy"] > 0
    table = (out / "results.md").read_text()
    assert "| base | 1 |" in table and "| soar | 1 |" in table and "SOAR vs SFT-more" in table
    assert (out / "accuracy_vs_time.png").stat().st_size > 0
    # --resume: every run is done, nothing retrains, the records are reused unchanged
    stamp = (out / "soar" / "seed0" / "done.json").stat().st_mtime_ns
    code, stdout, stderr = run_cli("bench", "shapes", *SMALL, "--output", out, "--resume")
    assert code == 0, stderr
    assert "done (resume)" in stdout
    assert (out / "soar" / "seed0" / "done.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "results.json").read_text())["methods"] == results["methods"]


def test_bench_rejects_unknown_method(run_cli, tmp_path):
    code, _, stderr = run_cli("bench", "shapes", "--methods", "nft,kto", "--output", tmp_path)
    assert code == 2 and "kto" in stderr and "sft-more" in stderr


def test_curve_points_evaluate_each_timed_checkpoint(run_cli, tmp_path):
    """`--curve-minutes`: the run keeps a checkpoint each M minutes (here every step) and each is evaluated like the
    final model; the x value is the training time up to that step."""
    out = tmp_path / "curves"
    small = ("--budget-minutes", "10", "--seeds", "1", "--methods", "sft-more", "--eval", "8", "--eval-steps", "2",
             "--jobs", "1", "--curve-minutes", "0.000001", "--set", "train.max_num_steps=3",
             "--set", "train.train_batch_per_replica=4", "--set", "train.train_policy.mini_batch=4")  # fmt: skip
    code, _, stderr = run_cli("bench", "shapes", *small, "--output", out)
    assert code == 0, stderr
    run = json.loads((out / "results.json").read_text())["runs"][1]
    curve = run["curve"]
    assert [p["step"] for p in curve] == [1, 2]  # the final step 3 is the run's own record
    times = [p["train_minutes"] for p in curve] + [run["train_minutes"]]
    assert 0 < times[0] < times[1] < times[2]
    for p in curve:
        strict = p["summary"]["scores"]["shapes/strict"]
        assert strict["n"] == 8 and 0.0 <= strict["mean"] <= 1.0
    ckpts = sorted(p.name for p in (out / "sft-more" / "seed0" / "checkpoints").iterdir())
    assert ckpts == ["step_00000001", "step_00000002", "step_00000003"]  # every timed save kept (max_keep 0)
    table = (out / "results.md").read_text()
    assert "## Held-out curves" in table and "| sft-more | 0 | 0 | 0.0 |" in table  # the base at minute 0
    assert "| sft-more | 0 | 2 |" in table and "| sft-more | 0 | 3 |" in table
    (stability,) = json.loads((out / "results.json").read_text())["stability"]  # best and end of the curve
    assert stability["end_step"] == 3 and stability["best_step"] in (0, 1, 2, 3)
    assert "## Best and end point of each curve (shapes/exact)" in table and "| sft-more | 0 | " in table
    assert (out / "curves.png").stat().st_size > 0
