"""Flow-GRPO task helpers without a model: Fast windows, trained steps, loss weights, zero-std groups, the ratio
self-check, config checks and the plan."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import torch

from sanarl.core.flow import sigma_grid
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import load_config
from sanarl.methods.flow_grpo.config import validate as check_grpo_config
from sanarl.methods.flow_grpo.task import FlowGRPOTask, _RatioMonitor, _signal_mask
from sanarl.methods.flow_grpo.trajectory import sde_window, trainable_positions
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.group_rl.task_base import set_loss_weights
from sanarl.rewards.combine import RewardResult

PRESET = Path(__file__).resolve().parents[2] / "tests" / "data" / "presets" / "grpo-tiny.toml"


def test_sde_window_lies_inside_the_range_and_covers_it():
    assert sde_window(0, [0, 10], 10, torch.Generator().manual_seed(0)) is None
    gen = torch.Generator().manual_seed(0)
    windows = [sde_window(2, [1, 5], 6, gen) for _ in range(300)]
    starts = Counter(a for a, _ in windows)
    assert set(starts) == {1, 2, 3} and all(n > 60 for n in starts.values())  # uniform on [r0, r1 - size]
    assert all(b == a + 2 for a, b in windows)
    again = torch.Generator().manual_seed(0)
    assert [
        sde_window(2, [1, 5], 6, again) for _ in range(300)
    ] == windows  # a pure function of the generator
    with pytest.raises(ValueError):
        sde_window(3, [2, 4], 6, gen)


def test_trainable_positions_skip_the_deterministic_cps_landing():
    sigmas = sigma_grid(4, 1.0)  # [1, 0.75, 0.5, 0.25, 0]
    assert trainable_positions([0, 1, 2, 3], sigmas, "flow_sde") == [0, 1, 2, 3]
    assert trainable_positions([0, 1, 2, 3], sigmas, "cps") == [0, 1, 2]  # 0.25 -> 0 has std 0 * sin(.) = 0
    assert trainable_positions([2, 3], sigmas, "cps") == [0]


@pytest.mark.parametrize("num_micro", [4, 6])
def test_loss_weights_turn_uneven_chunks_into_a_row_mean(num_micro):
    losses = torch.arange(14, dtype=torch.float64).reshape(7, 2) ** 1.5  # 7 samples x 2 trained steps
    chunks = [slice(0, 4), slice(4, 7)]
    batches = [{"adv": torch.zeros(c.stop - c.start), "rows": losses[c, j]} for c in chunks for j in range(2)]
    set_loss_weights(batches, num_micro)  # num_micro > 4: zero-weight padding for DDP
    assert [b["weight"] for b in batches] == pytest.approx(
        [4 * num_micro / 14] * 2 + [3 * num_micro / 14] * 2
    )
    runner_total = sum(b["weight"] * b["rows"].mean() for b in batches) / num_micro
    assert float(runner_total) == pytest.approx(float(losses.mean()), rel=1e-12)


def _group(prompt: str, rewards: list[float]) -> PromptGroup:
    total = torch.tensor(rewards)
    result = RewardResult(total, {}, torch.isnan(total), {})
    return PromptGroup(prompt, {}, None, list(range(len(rewards))), None, None, result)


def test_groups_with_equal_finite_rewards_are_dropped_and_counted():
    nan = float("nan")
    groups = [
        _group("a", [1, 1, 1]),
        _group("b", [1, 2, nan]),
        _group("c", [3, nan, 3]),
        _group("d", [nan] * 3),
    ]
    keep = ~torch.cat([g.reward.nan_mask for g in groups])
    signal, dropped = _signal_mask(groups, keep)
    assert signal.tolist() == [False] * 3 + [True, True, False] + [False] * 6
    assert dropped == 2  # a and c; d has no finite reward (counted by reward/dropped instead)


def test_ratio_monitor_warns_once_per_step_on_the_first_micro_batch(caplog):
    caplog.set_level(logging.WARNING)
    monitor = _RatioMonitor(1e-3)
    assert monitor.metrics() == {}
    monitor.update(1.0, 1.0 + 5e-4)
    monitor.update(0.5, 2.0)  # later micro-batches never warn
    assert not caplog.records
    assert monitor.metrics() == pytest.approx({"ratio_min": 0.5, "ratio_max": 2.0, "ratio_first_dev": 5e-4})
    monitor.reset()
    monitor.update(0.99, 1.002)
    monitor.update(0.98, 1.0)
    assert len(caplog.records) == 1 and "ratio_warn_tolerance" in caplog.records[0].getMessage()
    assert monitor.metrics() == pytest.approx(
        {"ratio_min": 0.98, "ratio_max": 1.002, "ratio_first_dev": 0.01}
    )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["train.train_policy.clip_range=-1"], "clip_range"),
        (["train.train_policy.ratio_warn_tolerance=-1"], "ratio_warn_tolerance"),
        (["rollout.family=compile", "rollout.num_candidates=8"], "rollout.family"),
        (["rollout.num_candidates=8"], "num_candidates"),
        (["train.train_policy.sde_window_size=-1"], "sde_window_size"),
        (["train.train_policy.sde_window_size=3", "train.train_policy.sde_window_range=[2, 4]"], "sde_window_range"),
        (["policy.diffusers.sample.solver=cps", "train.train_policy.sde_window_size=2"], "cps"),
        (["policy.diffusers.sample.solver=cps", "policy.diffusers.sample.num_steps=1"], "num_steps >= 2"),
    ],
)  # fmt: skip
def test_config_checks_name_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:  # Flow-GRPO's checks run when the config loads
        load_config(PRESET, overrides)
    assert needle in str(err.value)


def test_the_tiny_preset_passes_and_its_plan_counts_backward_passes():
    cfg = load_config(PRESET).config
    check_grpo_config(cfg)
    plan = dict(FlowGRPOTask.describe(cfg, 100, 1))
    assert plan["trained steps"].startswith("2 per sample (max(1, int(4 x 0.5)))")
    assert "8 / mini_batch 4 = 2 per rank, x 2 trained steps = 4 backward passes" in plan["micro-batches"]
    assert "base model (LoRA disabled)" in plan["loss"]
    fast = load_config(PRESET, ["train.train_policy.sde_window_size=3"]).config
    assert dict(FlowGRPOTask.describe(fast, 100, 1))["trained steps"].startswith("3 per sample (every window")
