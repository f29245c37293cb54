"""Numerical checks of the SOAR targets (docs/algorithms.md, "SOAR" and "Numerical checks")."""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.soar_math import (
    SOAR_STEP_KINDS,
    aux_sigmas,
    corrective_target,
    renoise_toward,
    soar_normaliser,
    soar_step,
)


def _data(seed: int = 0, shape: tuple[int, ...] = (2, 3, 4, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(
        shape, generator=gen, dtype=torch.float64
    )


def _path(z0: torch.Tensor, z1: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    s_b = s.reshape(-1, *([1] * (z0.ndim - 1)))
    return (1 - s_b) * z0 + s_b * z1


def test_on_path_point_gives_exact_velocity() -> None:
    z0, z1 = _data()
    s0 = torch.tensor([0.8, 0.5], dtype=torch.float64)
    s1 = torch.tensor([0.6, 0.3], dtype=torch.float64)
    # path 0 with the oracle velocity z1 - z0 lands on the true path at s1
    z1p = soar_step("ode", _path(z0, z1, s0), z1 - z0, s0, s1, 0.5)
    torch.testing.assert_close(z1p, _path(z0, z1, s1), rtol=0, atol=1e-12)
    s_prime = aux_sigmas(s1, s0, 6, 1.5, torch.Generator().manual_seed(0))
    for p in range(6):
        z_prime = renoise_toward(z1p, z1, s1, s_prime[:, p])
        torch.testing.assert_close(z_prime, _path(z0, z1, s_prime[:, p]), rtol=0, atol=1e-12)
        torch.testing.assert_close(corrective_target(z_prime, z0, s_prime[:, p]), z1 - z0, rtol=0, atol=1e-11)


def test_renoise_by_hand_and_at_s1_one() -> None:
    z1p, z1 = torch.full((2, 1, 1, 1), 2.0), torch.full((2, 1, 1, 1), -1.0)
    # sample 0: a = (0.7 - 0.4) / 0.6 = 0.5 -> 0.5; sample 1: a = 0 -> z1'
    out = renoise_toward(z1p, z1, torch.tensor([0.4, 0.4]), torch.tensor([0.7, 0.4]))
    assert out.flatten().tolist() == pytest.approx([0.5, 2.0])
    at_one = renoise_toward(z1p, z1, torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]))
    assert at_one.flatten().tolist() == [-1.0, -1.0]  # no NaN: a = 1, the noise itself


def test_corrective_target_by_hand() -> None:
    z_prime = torch.tensor([1.0, 3.0]).reshape(2, 1, 1, 1)
    z0 = torch.tensor([0.0, 1.0]).reshape(2, 1, 1, 1)
    out = corrective_target(z_prime, z0, torch.tensor([0.5, 0.25]))
    assert out.flatten().tolist() == [2.0, 8.0]
    with pytest.raises(ValueError, match="s' > 0"):
        corrective_target(z_prime, z0, torch.tensor([0.5, 0.0]))


def test_aux_sigma_bounds() -> None:
    s0 = torch.tensor([0.9, 0.5, 0.2, 0.05])
    s1 = torch.tensor([0.875, 0.475, 0.175, 0.0])
    gen = torch.Generator().manual_seed(0)
    sp = aux_sigmas(s1, s0, 4000, 1.5, gen)
    assert sp.shape == (4, 4000)
    upper = torch.tensor([1.0, 0.75, 0.3, 0.075])  # min(1.5 s0, 1)
    assert bool((sp >= s1[:, None]).all()) and bool((sp <= upper[:, None]).all())
    # the draws fill the interval: extremes near both ends, mean near the midpoint
    span = upper - s1
    assert bool((sp.min(1).values - s1 < 0.01 * span).all())
    assert bool((upper - sp.max(1).values < 0.01 * span).all())
    torch.testing.assert_close(sp.mean(1), (s1 + upper) / 2, rtol=0, atol=0.03)
    # same generator seed -> same draws; ratio 1 keeps s' in [s1, s0]
    torch.testing.assert_close(
        aux_sigmas(s1, s0, 5, 1.5, torch.Generator().manual_seed(3)),
        aux_sigmas(s1, s0, 5, 1.5, torch.Generator().manual_seed(3)),
    )
    sp1 = aux_sigmas(s1, s0, 500, 1.0, gen)
    assert bool((sp1 <= s0[:, None]).all())


def test_aux_sigma_errors() -> None:
    s = torch.tensor([0.5])
    with pytest.raises(ValueError, match="trajectory_length"):
        aux_sigmas(s - 0.1, s, 0, 1.5)
    with pytest.raises(ValueError, match="ratio >= 1"):
        aux_sigmas(s - 0.1, s, 2, 0.5)


def test_soar_steps_by_hand() -> None:
    z, v, noise = (torch.tensor([x]).reshape(1, 1, 1, 1).double() for x in (1.0, 0.5, 2.0))
    s0, s1 = torch.tensor([0.8]).double(), torch.tensor([0.6]).double()
    got = {k: float(soar_step(k, z, v, s0, s1, 0.5, noise)) for k in SOAR_STEP_KINDS}
    # dt = -0.2
    assert got["ode"] == pytest.approx(0.9)
    assert got["simple"] == pytest.approx(0.9 + 0.5 * math.sqrt(0.2) * 2)
    assert got["sde"] == pytest.approx(0.4 * (1 - 0.8 * 0.5) + 0.6 * 2)
    # flow_sde: std = sqrt(0.8 / 0.2) * 0.5 = 1; mean = (1 - 0.2 / 1.6) + 0.5 (1 + 0.2 / 1.6)(-0.2) = 0.7625
    assert got["flow_sde"] == pytest.approx(0.7625 + math.sqrt(0.2) * 2)
    # cps: std = 0.6 sin(pi / 4); x0_hat = 0.6, x1_hat = 1.1; sqrt(0.36 - std^2) = std
    std = 0.6 * math.sin(math.pi / 4)
    assert got["cps"] == pytest.approx(0.4 * 0.6 + std * 1.1 + std * 2)


@pytest.mark.parametrize("kind", ["flow_sde", "cps"])
def test_zero_noise_scale_is_euler(kind: str) -> None:
    z, v = _data(1)
    noise = torch.randn_like(z)
    s0 = torch.tensor([0.9, 0.4], dtype=torch.float64)
    s1 = torch.tensor([0.7, 0.0], dtype=torch.float64)
    euler = soar_step("ode", z, v, s0, s1, 0.0)
    # flow_sde / cps run in float32 (sanarl.core.samplers)
    torch.testing.assert_close(soar_step(kind, z, v, s0, s1, 0.0, noise), euler, rtol=0, atol=1e-6)


def test_flow_sde_guard_at_s0_one() -> None:
    z, v, noise = (torch.ones(1, 1, 1, 1, dtype=torch.float64) for _ in range(3))
    out = soar_step("flow_sde", z, v, torch.tensor([1.0]).double(), torch.tensor([0.75]).double(), 0.5, noise)
    # std = sqrt(1 / (1 - 0.75)) * 0.5 = 1; mean = 1 + 1 / 2 * (-0.25) + 1 * (1 + 0) * (-0.25) = 0.625
    assert float(out) == pytest.approx(0.625 + 1.0 * 0.5 * 1.0)
    with pytest.raises(ValueError, match="share one s1"):
        z2 = torch.ones(2, 1, 1, 1)
        soar_step("flow_sde", z2, z2, torch.tensor([1.0, 1.0]), torch.tensor([0.75, 0.5]), 0.5, z2)


def test_soar_step_errors() -> None:
    z = torch.zeros(1, 1, 1, 1)
    with pytest.raises(ValueError, match="unknown SOAR step type 'euler'"):
        soar_step("euler", z, z, 0.5, 0.4, 0.5, z)
    with pytest.raises(ValueError, match="needs noise"):
        soar_step("sde", z, z, 0.5, 0.4, 0.5)
    with pytest.raises(ValueError, match="s1 <= s0"):
        soar_step("simple", z, z, 0.4, 0.5, 0.5, z)
    with pytest.raises(ValueError, match="s1 <= s0"):
        soar_step("simple", z, z, 0.4, -0.1, 0.5, z)


def test_normaliser() -> None:
    assert soar_normaliser(8, 48, 1.0) == 56.0  # 8 samples, P = 6, M = 1
    assert soar_normaliser(3, 4, 0.5) == 5.0
    assert soar_normaliser(0, 0, 1.0) == 1.0
    assert float(soar_normaliser(torch.tensor(0.0), torch.tensor(1.0), 0.5)) == 1.0
    assert float(soar_normaliser(torch.tensor(2.0), torch.tensor(6.0), 2.0)) == 14.0


def _hy_soar_level(t: float, shift: float) -> float:
    """HY-SOAR's level of a t in [0, 1], by hand: SD3.5's FlowMatchEulerDiscreteScheduler (1000 train timesteps,
    no set_timesteps) holds sigmas[i] = shift((1000 - i) / 1000), i = 0..999, shifted as k x / (1 + (k - 1) x);
    t reads sigmas[min(trunc((1 - t) 1000), 999)]."""
    index = min(int((1.0 - t) * 1000), 999)
    x = (1000 - index) / 1000
    return shift * x / (1 + (shift - 1) * x)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_scheduler_table_levels_match_hy_soar_lookup_by_hand(shift: float) -> None:
    """s0 at u, s1 at t1 = max(u - 1/N, 0), active = t1 > 0, N = 40. The u are off the 1/1000 bin edges so float32
    and the float64 hand derivation truncate alike; 0.0101 and 0.0203 sit at the boundary t1 = 0 (s1 = sigmas[999]
    = shift(0.001), not 0), 0.9996 reads sigmas[0] = 1."""
    from sanarl.methods.soar.task import soar_levels

    u = [0.3337, 0.0101, 0.0203, 0.9996, 0.71234, 0.0613]
    s0, s1, active = soar_levels(torch.tensor(u), 40, shift, "scheduler_table")
    t1 = [max(x - 1 / 40, 0.0) for x in u]
    torch.testing.assert_close(s0, torch.tensor([_hy_soar_level(x, shift) for x in u]), rtol=0, atol=1e-6)
    torch.testing.assert_close(s1, torch.tensor([_hy_soar_level(x, shift) for x in t1]), rtol=0, atol=1e-6)
    assert active.tolist() == [x > 0 for x in t1] == [True, False, False, True, True, True]
    assert float(s1[1]) == pytest.approx(shift * 0.001 / (1 + (shift - 1) * 0.001), rel=1e-5)
    assert float(s0[3]) == 1.0
    # by hand for shift 1: u = 0.3337 -> index 666 -> 0.334; t1 = 0.3087 -> index 691 -> 0.309
    if shift == 1.0:
        assert s0[0].item() == pytest.approx(0.334, abs=1e-6) and s1[0].item() == pytest.approx(
            0.309, abs=1e-6
        )
    # the continuous grid is shift(u), shift(t1), with s1 = 0 at the boundary
    c0, c1, c_active = soar_levels(torch.tensor(u), 40, shift, "continuous")
    shifted = [shift * x / (1 + (shift - 1) * x) for x in u]
    torch.testing.assert_close(c0, torch.tensor(shifted), rtol=0, atol=1e-6)
    assert float(c1[1]) == 0.0 and torch.equal(c_active, active)
    with pytest.raises(ValueError, match="level grid"):
        soar_levels(torch.tensor(u), 40, shift, "table")


def test_flow_sde_at_s0_one_uses_the_given_first_next_by_hand() -> None:
    """HY-SOAR's flow_sde step at s0 = 1 puts the scheduler table's second level in place of s0 in the std:
    std = eta sqrt(1 / (1 - first_next)), mean = z (1 + std^2 dt / 2) + v dt, z' = mean + std sqrt(-dt) noise."""
    z, v, noise = (torch.tensor([[[[x]]]]) for x in (0.4, -1.2, 0.7))
    first_next, s1, eta = 1 - 2**-11, 1 - 2**-6, 0.5  # exact in float32, the step's arithmetic
    dt = s1 - 1.0
    std = eta * math.sqrt(1.0 / (1.0 - first_next))
    expected = 0.4 * (1 + std**2 * dt / 2) + (-1.2) * dt + std * math.sqrt(-dt) * 0.7
    got = soar_step("flow_sde", z, v, torch.tensor([1.0]), torch.tensor([s1]), eta, noise, first_next)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # without it the step keeps its former stand-in, the samples' own s1
    std_s1 = eta * math.sqrt(1.0 / (1.0 - s1))
    former = 0.4 * (1 + std_s1**2 * dt / 2) + (-1.2) * dt + std_s1 * math.sqrt(-dt) * 0.7
    assert soar_step(
        "flow_sde", z, v, torch.tensor([1.0]), torch.tensor([s1]), eta, noise
    ).item() == pytest.approx(former, rel=1e-5)


def test_aux_model_level_matches_hy_soar_round_trip_by_hand() -> None:
    """HY-SOAR evaluates an auxiliary point's velocity at a table level: i = the first entry <= s' of the
    descending table, t = 1 - i / 1000, then the lookup of t (the round trip runs in float32, so some i come back
    as i - 1: re-done here step by step with numpy float32)."""
    import numpy as np

    from sanarl.methods.soar.task import aux_model_level, scheduler_table

    shift = 3.0
    x = np.arange(1000, 0, -1, dtype=np.float32) / np.float32(1000)
    table = np.float32(shift) * x / (np.float32(1) + np.float32(shift - 1) * x)
    s_prime = np.array([1.0, 0.99985, 0.75, 0.5, 0.3, 0.0031, 0.0001], dtype=np.float32)
    expected = []
    for sp in s_prime:
        i = next((k for k, level in enumerate(table) if level <= sp), 1000)
        i = min(i, 999)
        t = np.float32(1) - np.float32(i) / np.float32(1000)
        index = min(int((np.float32(1) - t) * np.float32(1000)), 999)
        expected.append(table[index])
    torch.testing.assert_close(scheduler_table(shift), torch.from_numpy(table), rtol=0, atol=0)
    got = aux_model_level(torch.from_numpy(s_prime), scheduler_table(shift))
    torch.testing.assert_close(got, torch.tensor(expected), rtol=0, atol=0)
    assert got[0].item() == 1.0 and got[-1].item() == table[-1]  # s' below the table reads its last level
