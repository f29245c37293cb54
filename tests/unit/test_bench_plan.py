"""`sanarl bench shapes` defaults (NFT and Flow-GRPO-Fast, 1 seed, 30 minutes) and the full grid behind `--full`;
`--plan` prints the runs without running anything."""

from __future__ import annotations

import pytest

from sanarl.bench.plan import DEFAULT, FULL, BenchPlan, resolve_plan
from sanarl.errors import ConfigError, UserError


def test_defaults_and_the_full_grid():
    assert resolve_plan(False, None, None, None) == DEFAULT == BenchPlan(("nft", "grpo"), 1, 30.0, 5.0)
    assert FULL.curve_minutes == 0.0  # the full grid evaluates the final models only
    assert resolve_plan(True, None, None, None) == FULL
    assert FULL.methods == ("nft", "nft-solrl", "grpo", "soar", "sft-more") and FULL.seeds == 3
    # 2 runs side by side: one round of 30 minutes; the full grid: 15 runs -> 8 rounds of 4 minutes
    assert DEFAULT.training_wall_minutes(jobs=2) == 30.0 and FULL.training_wall_minutes(jobs=2) == 32.0


def test_explicit_options_replace_the_plan_values():
    plan = resolve_plan(True, "soar,sft-more", 2, None)
    assert plan == BenchPlan(("soar", "sft-more"), 2, 4.0)
    assert plan.runs() == [("soar", 0), ("soar", 1), ("sft-more", 0), ("sft-more", 1)]
    assert resolve_plan(False, None, 3, 12.5) == BenchPlan(("nft", "grpo"), 3, 12.5, 5.0)
    assert resolve_plan(False, None, None, None, 0.0).curve_minutes == 0.0
    with pytest.raises(UserError, match="--curve-minutes"):
        resolve_plan(False, None, None, None, -1.0)
    with pytest.raises(ConfigError, match="kto.*sft-more"):
        resolve_plan(False, "nft,kto", None, None)
    with pytest.raises(UserError, match="--seeds"):
        resolve_plan(False, None, 0, None)
    with pytest.raises(UserError, match="--budget-minutes"):
        resolve_plan(False, None, None, 0.0)


def test_ddrl_is_a_bench_method_with_its_rollout_cost():
    from sanarl.bench.methods import METHODS, RATIOS, rollout_cost
    from sanarl.config.presets import resolve_preset_path
    from sanarl.methods.config_loading import load_config

    plan = resolve_plan(False, "ddrl,grpo,nft,sft-more", 3, 30.0)
    assert plan.methods == ("ddrl", "grpo", "nft", "sft-more") and METHODS["ddrl"] == "tiny-shapes-ddrl"
    assert ("ddrl", "grpo") in [(a, b) for a, b, _ in RATIOS]
    cfg = load_config(resolve_preset_path("tiny-shapes-ddrl")).config
    assert rollout_cost(cfg, 10) == (
        640,
        640,
    )  # 64 rollout samples per step, each scored; the data are renderings
    synthetic = load_config(
        resolve_preset_path("tiny-shapes-ddrl"), ["train.train_policy.ddrl.data_source=synthetic"]
    ).config
    assert rollout_cost(synthetic, 10) == (640 + 80, 640)  # plus one unscored base sample per prompt group


def test_grpo_guard_is_a_bench_method_compared_with_flow_grpo():
    from sanarl.bench.methods import METHODS, RATIOS, rollout_cost
    from sanarl.config.presets import resolve_preset_path
    from sanarl.methods.config_loading import load_config

    assert resolve_plan(False, "grpo-guard,grpo", 1, 30.0).methods == ("grpo-guard", "grpo")
    assert METHODS["grpo-guard"] == "tiny-shapes-grpo-guard"
    assert ("grpo-guard", "grpo") in [(a, b) for a, b, _ in RATIOS]
    cfg = load_config(resolve_preset_path("tiny-shapes-grpo-guard")).config
    assert cfg.train.train_policy.ratio == "guard"
    assert rollout_cost(cfg, 10) == (640, 640)  # the rollout of Flow-GRPO: 64 samples per step, each scored


def test_plan_flag_prints_the_runs_and_runs_nothing(run_cli, tmp_path):
    out = tmp_path / "bench"
    code, stdout, stderr = run_cli("bench", "shapes", "--plan", "--output", out)
    assert code == 0, stderr
    flat = " ".join(stdout.split())
    assert "nft, grpo x 1 seed(s) = 2 run(s) of 30 training minutes, 2 at a time: 30 minutes" in flat
    assert "a held-out curve point at 5, 10, 15, 20, 25 training minutes and at the end" in flat
    assert not out.exists()
    code, stdout, _ = run_cli("bench", "shapes", "--plan", "--budget-minutes", "2", "--output", out)
    flat = " ".join(stdout.split())
    assert (
        "no held-out curve point before the end: --curve-minutes 5 is not shorter than the 2-minute" in flat
    )
    code, stdout, _ = run_cli("bench", "shapes", "--plan", "--budget-minutes", "2", "--curve-minutes", "0.5")
    assert "a held-out curve point at 0.5, 1, 1.5 training minutes and at the end" in " ".join(stdout.split())
    code, stdout, _ = run_cli("bench", "shapes", "--plan", "--full", "--jobs", "1", "--output", out)
    assert code == 0 and "15 run(s) of 4 training minutes, 1 at a time: 60 minutes" in " ".join(
        stdout.split()
    )
    code, _, stderr = run_cli("bench", "shapes", "--plan", "--seeds", "0", "--output", out)
    assert code == 2 and "--seeds" in stderr


def test_the_dpo_bench_methods_train_their_presets_on_pairs_and_on_prompts():
    from sanarl.bench.methods import METHODS, PLUGINS

    plan = resolve_plan(False, "dpo,dpo-online", 1, 5.0)
    assert plan.methods == ("dpo", "dpo-online")
    assert (METHODS["dpo"], PLUGINS["dpo"]) == ("tiny-shapes-dpo", "sanarl.datasets.shapes_pairs")
    assert (METHODS["dpo-online"], PLUGINS["dpo-online"]) == (
        "tiny-shapes-dpo-online",
        "sanarl.datasets.shapes",
    )
    assert PLUGINS["nft"] == "sanarl.datasets.shapes"
