"""Sol-RL's SANA rollout against sanarl: the draft selection `extremes_random`, the old-adapter decay type 3 and the
unshifted SANA sampling grid. Each reference quantity is re-derived here from Sol-RL's definitions (its
`select_indices_by_mode`, `return_decay`, `pipeline_with_logprob_sana`), never by calling the code under test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sanarl.core.flow import grid
from sanarl.core.selection import select_indices
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import load_config
from sanarl.training.ema import old_weight_decay

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "sanarl" / "presets"
SOL_RL_SANA = ("sana-image-nft-compile", "sana-image-nft-naive_quant", "sana-image-nft-naive_scaling",
               "sana-image-nft-sol_rl")  # fmt: skip


# --- extremes_random ----------------------------------------------------------------------------------------------
def _sol_rl_extremes_random(rewards: torch.Tensor, k: int, perm_of_rest) -> list[int]:
    """Sol-RL's mode by its definition: torch.unique (sorted) of the first argmax and the first argmin, cut to k;
    else those plus the first k - |extremes| of the remaining indices (increasing) in the order of a random
    permutation (here given: `perm_of_rest(n)`)."""
    total = rewards.shape[0]
    if total == 1:
        return [0]
    best = max(range(total), key=lambda i: (rewards[i].item(), -i))  # first index of the maximum
    worst = min(range(total), key=lambda i: (rewards[i].item(), i))  # first index of the minimum
    extremes = sorted({best, worst})
    if k <= len(extremes):
        return extremes[:k]
    remaining = [i for i in range(total) if i not in extremes]
    perm = perm_of_rest(len(remaining)).tolist()
    return extremes + [remaining[j] for j in perm[: k - len(extremes)]]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 24])
@pytest.mark.parametrize("case", ["distinct", "ties", "all_equal"])
def test_extremes_random_is_sol_rls(k, case):
    g = torch.Generator().manual_seed(7)
    rewards = {
        "distinct": torch.randn(96, generator=g),
        "ties": torch.tensor([0.5, 0.9, 0.1, 0.9, 0.1, 0.3] * 16),
        "all_equal": torch.full((96,), 0.25),
    }[case]
    seed = 11
    expected = _sol_rl_extremes_random(
        rewards, k, lambda n: torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    )
    got = select_indices(rewards, k, "extremes_random", generator=torch.Generator().manual_seed(seed))
    assert got.tolist() == sorted(expected)


def test_extremes_random_with_one_slot_keeps_one_fixed_extreme():
    rewards = torch.tensor([0.4, 0.9, 0.0, 0.5])  # argmax 1, argmin 2: the lower index, the best, is kept
    for seed in range(5):
        assert select_indices(
            rewards, 1, "extremes_random", generator=torch.Generator().manual_seed(seed)
        ).tolist() == [1]
    rewards = torch.tensor([0.4, 0.0, 0.9, 0.5])  # argmin 1 < argmax 2: the worst is kept
    assert select_indices(rewards, 1, "extremes_random").tolist() == [1]


def test_best_worst_random_is_the_former_mode_and_differs_at_24_of_96():
    """best_worst of k // 2 (the top 6 and bottom 6 for 24) then random: 12 fixed drafts against Sol-RL's 2."""
    rewards = torch.randn(96, generator=torch.Generator().manual_seed(0))
    order = torch.argsort(rewards, descending=True).tolist()
    kept = set(
        select_indices(rewards, 24, "best_worst_random", generator=torch.Generator().manual_seed(1)).tolist()
    )
    assert set(order[:6]) | set(order[-6:]) <= kept
    fixed = [set(select_indices(rewards, 24, "extremes_random", generator=torch.Generator().manual_seed(s)).tolist())
             for s in range(6)]  # fmt: skip
    always = set.intersection(*fixed)
    assert {order[0], order[-1]} <= always and len(always) < 12
    # k // 2 = 2: both modes keep the best and the worst, then random
    four = [set(select_indices(rewards, 4, m, generator=torch.Generator().manual_seed(2)).tolist())
            for m in ("extremes_random", "best_worst_random")]  # fmt: skip
    assert all({order[0], order[-1]} <= s for s in four)


# --- decay type 3 -------------------------------------------------------------------------------------------------
def _sol_rl_decay(step: int, decay_type: int, custom_step: int = 0, custom_value: float = 0.0) -> float:
    """Sol-RL's return_decay: (flat, uprate, uphold) per type; 0 before flat, else min((step - flat) uprate,
    uphold); type 3 = (0, value / step, value)."""
    flat, uprate, uphold = {
        0: (0, 0.0, 0.0),
        1: (0, 0.001, 0.5),
        2: (75, 0.0075, 0.999),
        3: (0, custom_value / max(custom_step, 1), custom_value),
    }[decay_type]
    return 0.0 if step < flat else min((step - flat) * uprate, uphold)


@pytest.mark.parametrize(("custom_step", "custom_value"), [(100, 0.5), (7, 0.9), (1, 0.3)])
def test_decay_type_3_is_sol_rls_custom_ramp(custom_step, custom_value):
    for k in [0, 1, 2, custom_step - 1, custom_step, custom_step + 1, 10 * custom_step]:
        assert old_weight_decay(k, 3, custom_step, custom_value) == pytest.approx(
            _sol_rl_decay(k, 3, custom_step, custom_value), abs=1e-15
        )
    for decay_type in (0, 1, 2):  # the other types unchanged
        for k in (0, 10, 80, 500):
            assert old_weight_decay(k, decay_type) == pytest.approx(_sol_rl_decay(k, decay_type), abs=1e-15)


def test_decay_type_3_config_needs_both_keys():
    preset = PRESETS / "tiny-shapes-nft.toml"
    cfg = load_config(preset, ["policy.diffusers.weight_copy_decay_type=3", "policy.diffusers.custom_decay_step=50",
                               "policy.diffusers.custom_decay_value=0.6"]).config  # fmt: skip
    assert (cfg.policy.diffusers.custom_decay_step, cfg.policy.diffusers.custom_decay_value) == (50, 0.6)
    with pytest.raises(ConfigError, match=r"custom_decay_step > 0|set both > 0"):
        load_config(preset, ["policy.diffusers.weight_copy_decay_type=3"])


# --- the SANA grid ------------------------------------------------------------------------------------------------
def test_sol_rl_sana_presets_sample_on_the_unshifted_grid():
    """Sol-RL's SANA sampler: sigmas = linspace(1, 0, N + 1), no shift, for rollouts and evaluation alike; the
    Cosmos-RL SANA preset keeps the scheduler's shifted grid."""
    from sanarl.training.sampling import GenerationSpec

    class _Adapter:  # a SANA adapter's grid choice: its pipeline samples on the scheduler's own grid
        def shift_for(self, height, width):
            return 3.0

        def grid_name(self, requested=None):
            return requested or "flow_match_euler"

        def sigmas(self, num_steps, shift, grid_name=None, *, device=None):
            return grid(self.grid_name(grid_name), num_steps, shift, num_train_timesteps=1000, device=device)

    for name in SOL_RL_SANA:
        sample = load_config(PRESETS / f"{name}.toml").config.policy.diffusers.sample
        assert sample.sigma_grid == "uniform", name
        for evaluation, steps in ((False, 10), (True, 40)):
            spec = GenerationSpec.from_sample_config(sample, _Adapter(), [1024, 1024], evaluation=evaluation)
            expected = torch.tensor([1.0 - i / steps for i in range(steps + 1)])
            torch.testing.assert_close(spec.sigmas(_Adapter()), expected, atol=1e-7, rtol=0)
    cosmos = load_config(PRESETS / "sana-image-nft.toml").config.policy.diffusers.sample
    assert cosmos.sigma_grid is None
    spec = GenerationSpec.from_sample_config(cosmos, _Adapter(), [1024, 1024], evaluation=False)
    assert spec.sigmas(_Adapter())[1].item() > 0.95  # shift 3: 3 * 0.9 / (1 + 2 * 0.9) = 0.964
