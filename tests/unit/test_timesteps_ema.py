"""Numerical checks of sanarl.core.timesteps and sanarl.training.ema (docs/algorithms.md, "SFT",
"DiffusionNFT" and "Numerical checks")."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sanarl.core.timesteps import SCHEMES, loss_weight, mode_warp, sample_u, u_to_sigma
from sanarl.training.ema import EMA, decay_old_weights, old_weight_decay

N_DRAWS = 200_000


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ densities


def test_logit_normal_moments_of_logit_u():
    u = sample_u("logit_normal", N_DRAWS, generator=_gen(0), logit_mean=0.5, logit_std=1.3)
    assert u.shape == (N_DRAWS,) and u.dtype == torch.float32
    z = torch.logit(u.double())
    assert z.mean().item() == pytest.approx(0.5, abs=0.02)
    assert z.std().item() == pytest.approx(1.3, abs=0.02)


def test_mode_warp_by_hand_and_density_inside_unit_interval():
    # t = 0.25: cos^2(pi / 8) = 0.8535534; u = 0.75 - 1.29 * (0.8535534 - 1 + 0.25) = 0.6164161
    t = torch.tensor([0.0, 0.25, 0.5, 1.0])
    expected = [1.0, 0.75 - 1.29 * (math.cos(math.pi / 8) ** 2 - 0.75), 0.5, 0.0]
    assert mode_warp(t, 1.29).tolist() == pytest.approx(expected, abs=1e-6)
    assert expected[1] == pytest.approx(0.6164161, abs=1e-6)
    torch.testing.assert_close(mode_warp(t, 0.0), 1 - t)  # m = 0: uniform
    u = sample_u("mode", N_DRAWS, generator=_gen(1), mode_scale=1.29)
    assert bool(((u > 0) & (u < 1)).all())
    grid = torch.linspace(0, 1, 1001)
    assert bool((mode_warp(grid, 1.29).diff() < 0).all())  # monotone, so (0, 1) maps into (0, 1)


@pytest.mark.parametrize("scheme", ["uniform", "sigma_sqrt", "cosmap"])
def test_uniform_draws_for_weighted_schemes(scheme):
    u = sample_u(scheme, N_DRAWS, generator=_gen(2))
    assert bool(((u >= 0) & (u < 1)).all())
    assert u.mean().item() == pytest.approx(0.5, abs=0.005)
    assert u.var().item() == pytest.approx(1 / 12, abs=0.002)


def test_sample_u_is_reproducible_and_rejects_unknown_scheme():
    a = sample_u("logit_normal", 8, generator=_gen(3), device="cpu")
    b = sample_u("logit_normal", 8, generator=_gen(3))
    assert torch.equal(a, b)
    assert torch.equal(a, torch.sigmoid(torch.randn(8, generator=_gen(3))))
    with pytest.raises(ValueError, match="weighting_scheme"):
        sample_u("lognorm", 4, generator=None)
    with pytest.raises(ValueError, match="weighting_scheme"):
        loss_weight("lognorm", torch.ones(2))


def test_loss_weights_by_hand():
    s = torch.tensor([0.5, 0.25, 0.0])
    for scheme in ("logit_normal", "mode", "uniform"):
        torch.testing.assert_close(loss_weight(scheme, s), torch.ones(3))
    torch.testing.assert_close(loss_weight("sigma_sqrt", s), torch.tensor([4.0, 16.0, 1e6]))
    # cosmap: 1 - 2s + 2s^2 = 0.5, 0.625, 1 -> 2 / (pi * that)
    expected = torch.tensor([4 / math.pi, 3.2 / math.pi, 2 / math.pi])
    torch.testing.assert_close(loss_weight("cosmap", s), expected)
    # cosmap is a density on [0, 1]: its integral is (2 / pi) * (atan(1) - atan(-1)) = 1
    grid = torch.linspace(0, 1, 20001)
    assert torch.trapezoid(loss_weight("cosmap", grid), grid).item() == pytest.approx(1.0, abs=1e-6)
    assert set(SCHEMES) == {"logit_normal", "mode", "uniform", "sigma_sqrt", "cosmap"}


def test_u_to_sigma_applies_the_grid_shift():
    u = torch.tensor([0.0, 0.25, 0.5, 1.0])
    torch.testing.assert_close(u_to_sigma(u, 1.0), u)
    torch.testing.assert_close(u_to_sigma(u, 3.0), torch.tensor([0.0, 0.5, 0.75, 1.0]))


# ------------------------------------------------------------------------------------------------ EMA


def _module(value: float) -> nn.Module:
    m = nn.Linear(1, 1, bias=True)
    with torch.no_grad():
        m.weight.fill_(value)
        m.bias.fill_(0.0)
    m.bias.requires_grad_(False)  # frozen: not tracked with only_trainable=True
    return m


def _set(m: nn.Module, value: float) -> None:
    with torch.no_grad():
        m.weight.fill_(value)


def test_ema_three_steps_by_hand():
    m = _module(1.0)
    ema = EMA.from_module(m, decay=0.5)
    assert ema.names == ["weight"] and ema.shadow[0].dtype == torch.float32
    # k = 0: d = min(1/10, 0.5) = 0.1; ema = 1 + 0.9 (3 - 1) = 2.8
    # k = 1: d = min(2/11, 0.5) = 2/11; ema = 2.8 + (9/11)(5 - 2.8) = 4.6
    # k = 2: d = min(3/12, 0.5) = 0.25; ema = 4.6 + 0.75 (-1 - 4.6) = 0.4
    expected = [2.8, 4.6, 0.4]
    for k, (p, e) in enumerate(zip([3.0, 5.0, -1.0], expected, strict=True)):
        _set(m, p)
        assert ema.update(m, k)
        assert ema.shadow[0].item() == pytest.approx(e, abs=1e-6)
    assert ema.current_decay(100) == 0.5  # capped by ema_decay


def test_ema_interval_and_zero_interval():
    m = _module(0.0)
    every = EMA.from_module(m, decay=0.9, interval=0)
    sparse = EMA.from_module(m, decay=0.9, interval=2)
    applied = []
    for k in range(4):
        _set(m, float(k + 1))
        assert every.update(m, k)
        applied.append(sparse.update(m, k))
    assert applied == [False, True, False, True]  # after steps 1 and 3: (k + 1) % 2 == 0
    # sparse: k = 1: d = 2/11, 0 -> (9/11) * 2 ; k = 3: d = 4/13, e -> e + (9/13)(4 - e)
    e = 18 / 11
    e = e + (9 / 13) * (4 - e)
    assert sparse.shadow[0].item() == pytest.approx(e, abs=1e-6)


def test_ema_copy_swap_and_state_dict_roundtrip():
    m = _module(1.0).to(torch.bfloat16)
    ema = EMA.from_module(m, decay=0.9)
    _set(m, 2.0)
    ema.update(m, 0)  # 1 + 0.9 * (2 - 1) = 1.9
    with ema.swap(m):
        assert m.weight.item() == pytest.approx(1.9, abs=1e-2)  # bf16 holds the EMA value
    assert m.weight.item() == 2.0  # restored
    state = ema.state_dict()
    other = EMA.from_module(_module(0.0), decay=0.1, interval=5)
    other.load_state_dict(state)
    assert other.shadow[0].item() == pytest.approx(1.9, abs=1e-6)
    assert (other.decay, other.interval) == (0.9, 1)
    target = _module(0.0)
    other.copy_to(target)
    assert target.weight.item() == pytest.approx(1.9, abs=1e-6)
    full = EMA.from_module(m, decay=0.9, only_trainable=False)
    assert full.names == ["weight", "bias"]
    with pytest.raises(ValueError, match="different parameters"):
        full.load_state_dict(state)
    with pytest.raises(ValueError, match="ema_decay"):
        EMA.from_module(m, decay=1.5)


# ------------------------------------------------------------------------------------------------ old-policy decay


def test_decay_old_weights_matches_closed_form():
    old, new = [torch.tensor([1.0, -2.0])], [torch.tensor([5.0, 4.0])]
    d = 0.3
    for _ in range(3):
        decay_old_weights(old, new, d)
    # constant new: old_n = d^n old_0 + (1 - d^n) new
    expected = [d**3 * 1.0 + (1 - d**3) * 5.0, d**3 * -2.0 + (1 - d**3) * 4.0]
    assert old[0].tolist() == pytest.approx(expected, abs=1e-6)
    decay_old_weights(old, new, 0.0)
    assert old[0].tolist() == [5.0, 4.0]  # d = 0 copies theta (strictly on-policy)
    with pytest.raises(ValueError, match="shape mismatch"):
        decay_old_weights([torch.zeros(2)], [torch.zeros(3)], 0.5)


def test_old_weight_decay_schedules():
    assert [old_weight_decay(k, 0) for k in (0, 10, 10_000)] == [0.0, 0.0, 0.0]
    assert [old_weight_decay(k, 1) for k in (0, 100, 499, 1000)] == pytest.approx([0.0, 0.1, 0.499, 0.5])
    assert [old_weight_decay(k, 2) for k in (0, 74, 75, 100, 300)] == pytest.approx(
        [0.0, 0.0, 0.0, 0.1875, 0.999]
    )
    with pytest.raises(ValueError, match="weight_copy_decay_type"):
        old_weight_decay(1, 3)
