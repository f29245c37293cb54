"""Numerical checks of sanarl.core.flow and sanarl.core.samplers (docs/algorithms.md, "Conventions",
"Samplers" and "Numerical checks")."""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.flow import (
    broadcast_sigma,
    interpolate,
    model_timestep,
    shift_sigmas,
    sigma_grid,
    velocity_target,
    x0_from_velocity,
)
from sanarl.core.samplers import (
    cfg_velocity,
    cps_step,
    dpm2_step,
    euler_step,
    flow_sde_step,
    initial_noise,
    sample_loop,
)

SHAPE = (2, 3, 4, 4)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _random_grid(num_steps: int, seed: int) -> torch.Tensor:
    """A strictly decreasing grid from 1 to 0 with random interior points."""
    inner = (
        torch.rand(num_steps - 1, generator=torch.Generator().manual_seed(seed)).sort(descending=True).values
    )
    return torch.cat([torch.ones(1), inner, torch.zeros(1)])


def _oracle(x0: torch.Tensor):
    """The velocity that points every state straight at x0: v = (x - x0) / s, so x0_hat = x - s v = x0."""
    return lambda x, s: (x - x0) / broadcast_sigma(s, x)


def _smooth_velocity(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """A per-sample (no batch mixing), non-linear, non-oracle velocity field."""
    return torch.tanh(x) * (1 + broadcast_sigma(s, x)) - 0.3 * x


# ------------------------------------------------------------------------------------------------ flow conventions


def test_interpolate_endpoints_and_midpoint():
    x0, eps = _randn(*SHAPE, seed=0), _randn(*SHAPE, seed=1)
    assert torch.equal(interpolate(x0, eps, 0.0), x0)
    assert torch.equal(interpolate(x0, eps, 1.0), eps)
    mixed = interpolate(x0, eps, torch.tensor([0.0, 1.0]))
    assert torch.equal(mixed[0], x0[0]) and torch.equal(mixed[1], eps[1])
    torch.testing.assert_close(interpolate(x0, eps, 0.25), 0.75 * x0 + 0.25 * eps)


def test_velocity_target_and_x0_roundtrip():
    x0, eps = _randn(*SHAPE, seed=0), _randn(*SHAPE, seed=1)
    s = torch.tensor([0.3, 0.8])
    v = velocity_target(x0, eps)
    torch.testing.assert_close(v, eps - x0)
    torch.testing.assert_close(x0_from_velocity(interpolate(x0, eps, s), s, v), x0, atol=1e-6, rtol=0)


def test_broadcast_sigma_rejects_wrong_batch():
    assert broadcast_sigma(torch.tensor([0.1, 0.2]), torch.zeros(SHAPE)).shape == (2, 1, 1, 1)
    with pytest.raises(ValueError, match="does not match a batch"):
        broadcast_sigma(torch.tensor([0.1, 0.2, 0.3]), torch.zeros(SHAPE))


def test_shift_and_sigma_grid_by_hand():
    # shift(u, 3) = 3u / (1 + 2u): u = 0.75 -> 2.25 / 2.5 = 0.9, 0.5 -> 1.5 / 2 = 0.75, 0.25 -> 0.75 / 1.5 = 0.5
    assert shift_sigmas(0.5, 1.0) == 0.5
    assert shift_sigmas(0.25, 3.0) == pytest.approx(0.5)
    grid = sigma_grid(4, 3.0)
    assert grid.dtype == torch.float32
    torch.testing.assert_close(grid, torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]), atol=1e-7, rtol=0)
    torch.testing.assert_close(sigma_grid(1, 5.0), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="num_steps"):
        sigma_grid(0, 3.0)


def test_model_timestep_is_float_times_1000():
    assert model_timestep(0.1234) == pytest.approx(123.4)
    out = model_timestep(torch.tensor([0.00051, 0.5]))
    torch.testing.assert_close(out, torch.tensor([0.51, 500.0]))


def test_cfg_velocity():
    vu, vc = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -2.0]])
    torch.testing.assert_close(cfg_velocity(vu, vc, 1.0), vc)
    torch.testing.assert_close(cfg_velocity(vu, vc, 0.0), vu)
    torch.testing.assert_close(cfg_velocity(vu, vc, 4.5), torch.tensor([[10.0, -16.0]]))


# ------------------------------------------------------------------------------------------------ ODE solvers


@pytest.mark.parametrize("solver", ["euler", "dpm2"])
@pytest.mark.parametrize("num_steps, seed", [(1, 0), (2, 1), (5, 2), (13, 3)])
def test_ode_solvers_with_oracle_velocity_return_x0(solver, num_steps, seed):
    x0, start = (
        _randn(*SHAPE, seed=10 + seed),
        3 * _randn(*SHAPE, seed=20 + seed),
    )  # any start, not just noise
    grid = _random_grid(num_steps, seed)
    out = sample_loop(_oracle(x0), start, grid, solver=solver)
    torch.testing.assert_close(out.latents, x0, atol=1e-5, rtol=0)
    assert out.log_probs is None and out.timesteps_used == []


@pytest.mark.parametrize("solver", ["euler", "dpm2"])
def test_constant_oracle_velocity_stays_on_the_straight_path(solver):
    x0, eps = _randn(*SHAPE, seed=0), _randn(*SHAPE, seed=1)
    grid = sigma_grid(6, 3.0)
    out = sample_loop(lambda x, s: eps - x0, eps, grid, solver=solver, return_trajectory=True)
    assert len(out.trajectory) == 7
    for x_i, s_i in zip(out.trajectory, grid.tolist(), strict=True):
        torch.testing.assert_close(x_i, interpolate(x0, eps, s_i), atol=1e-5, rtol=0)


def test_dpm2_first_step_is_euler_then_second_order_by_hand():
    x, v1, v2 = _randn(*SHAPE, seed=0), _randn(*SHAPE, seed=1), _randn(*SHAPE, seed=2)
    x1, state = dpm2_step(x, v1, 0.8, 0.6, None)
    torch.testing.assert_close(x1, euler_step(x, v1, 0.8, 0.6))
    x2, state2 = dpm2_step(x1, v2, 0.6, 0.3, state)
    # hand: lambda(s) = log((1-s)/s); h = l(0.3) - l(0.6); h_prev = l(0.6) - l(0.8)
    lam = lambda s: math.log((1 - s) / s)  # noqa: E731
    h, h_prev = lam(0.3) - lam(0.6), lam(0.6) - lam(0.8)
    d0, d_prev = x1 - 0.6 * v2, x - 0.8 * v1
    d = d0 + 0.5 * (h / h_prev) * (d0 - d_prev)
    expected = (0.3 / 0.6) * x1 + 0.7 * (1 - math.exp(-h)) * d
    torch.testing.assert_close(x2, expected, atol=1e-6, rtol=1e-6)
    # the final step to s' = 0 is first order (lower_order_final): x' = x0_hat whatever the history
    x3, state3 = dpm2_step(x2, v1, 0.3, 0.0, state2)
    torch.testing.assert_close(x3, x2 - 0.3 * v1, atol=1e-6, rtol=0)
    assert state3.s.tolist() == pytest.approx([0.3, 0.3])


def test_dpm2_after_s_equal_one_is_first_order():
    # lambda(1) = -inf, so h / h_prev = 0 and the step after the s = 1 step reduces to Euler (the exact limit)
    x, v1, v2 = _randn(*SHAPE, seed=3), _randn(*SHAPE, seed=4), _randn(*SHAPE, seed=5)
    x1, state = dpm2_step(x, v1, 1.0, 0.7, None)
    x2, _ = dpm2_step(x1, v2, 0.7, 0.4, state)
    torch.testing.assert_close(x2, euler_step(x1, v2, 0.7, 0.4), atol=1e-6, rtol=0)
    assert torch.isfinite(x2).all()


# ------------------------------------------------------------------------------------------------ stochastic steps


def test_flow_sde_with_eta_zero_equals_euler():
    x, v = _randn(*SHAPE, seed=0), _randn(*SHAPE, seed=1)
    for s, s_next in [(1.0, 0.9), (0.6, 0.35), (0.2, 0.0)]:
        x_next, logp, mean, std = flow_sde_step(x, v, s, s_next, eta=0.0, s_first_next=0.9)
        torch.testing.assert_close(x_next, euler_step(x, v, s, s_next), atol=0, rtol=0)
        torch.testing.assert_close(mean, x_next)
        assert torch.all(std == 0) and torch.all(logp == 0)


def _hand_flow_sde(x: float, v: float, s: float, s_next: float, eta: float, s1: float, z: float):
    dt = s_next - s
    std = eta * math.sqrt(s / (1 - (s if s < 1 else s1)))
    mean = x * (1 + std**2 / (2 * s) * dt) + v * (1 + std**2 * (1 - s) / (2 * s)) * dt
    sd = std * math.sqrt(-dt)
    x_next = mean + sd * z
    logp = -((x_next - mean) ** 2) / (2 * sd**2) - math.log(sd) - math.log(math.sqrt(2 * math.pi))
    return x_next, logp, mean, std


@pytest.mark.parametrize("s, s_next", [(0.5, 0.25), (1.0, 0.9)])
def test_flow_sde_step_and_log_prob_by_hand(s, s_next):
    x = torch.tensor([[0.3, -1.2], [2.0, 0.5]])
    v = torch.tensor([[-0.7, 0.4], [1.1, -0.2]])
    z = torch.tensor([[0.5, -1.5], [0.1, 2.0]])
    x_next, logp, mean, std = flow_sde_step(x, v, s, s_next, eta=0.7, s_first_next=0.9, noise=z)
    for b in range(2):
        hand = [
            _hand_flow_sde(x[b, j].item(), v[b, j].item(), s, s_next, 0.7, 0.9, z[b, j].item())
            for j in range(2)
        ]
        assert x_next[b].tolist() == pytest.approx([h[0] for h in hand], abs=1e-6)
        assert mean[b].tolist() == pytest.approx([h[2] for h in hand], abs=1e-6)
        assert logp[b].item() == pytest.approx(sum(h[1] for h in hand) / 2, abs=1e-5)
        assert std[b].item() == pytest.approx(hand[0][3], abs=1e-6)
    # s = 0.5 -> std = 0.7 * sqrt(0.5 / 0.5) = 0.7 ; s = 1 -> std = 0.7 * sqrt(1 / (1 - 0.9))
    assert std[0].item() == pytest.approx(0.7 if s < 1 else 0.7 * math.sqrt(10), abs=1e-6)


def test_flow_sde_log_prob_matches_torch_normal_and_reevaluation():
    x, v, x_other = _randn(*SHAPE, seed=0), _randn(*SHAPE, seed=1), _randn(*SHAPE, seed=2)
    v_train = v.clone().requires_grad_(True)
    _, logp, mean, std = flow_sde_step(x, v_train, 0.7, 0.5, eta=0.9, s_first_next=0.95, x_next=x_other)
    sd = std.detach()[:, None, None, None] * math.sqrt(0.2)
    oracle = torch.distributions.Normal(mean.detach(), sd).log_prob(x_other).mean(dim=(1, 2, 3))
    torch.testing.assert_close(logp.detach(), oracle, atol=1e-5, rtol=1e-5)
    logp.sum().backward()
    assert v_train.grad is not None and v_train.grad.abs().sum() > 0
    # rollout then re-evaluation of the stored sample gives the same log-prob
    gens = [torch.Generator().manual_seed(i) for i in range(SHAPE[0])]
    x_next, logp_roll, _, _ = flow_sde_step(x, v, 0.7, 0.5, eta=0.9, s_first_next=0.95, generator=gens)
    _, logp_again, _, _ = flow_sde_step(x, v, 0.7, 0.5, eta=0.9, s_first_next=0.95, x_next=x_next)
    torch.testing.assert_close(logp_roll, logp_again)


def test_cps_step_by_hand_and_log_prob_is_the_reference_squared_error():
    x, v, z = torch.tensor([[0.4, -0.8]]), torch.tensor([[1.5, 0.2]]), torch.tensor([[0.3, -0.6]])
    s, s_next, eta = 0.6, 0.4, 0.8
    x_next, logp, mean, std = cps_step(x, v, s, s_next, eta=eta, noise=z)
    sd = s_next * math.sin(eta * math.pi / 2)
    for j in range(2):
        x0_hat = x[0, j].item() - s * v[0, j].item()
        x1_hat = x[0, j].item() + (1 - s) * v[0, j].item()
        mu = (1 - s_next) * x0_hat + math.sqrt(s_next**2 - sd**2) * x1_hat
        assert mean[0, j].item() == pytest.approx(mu, abs=1e-6)
        assert x_next[0, j].item() == pytest.approx(mu + sd * z[0, j].item(), abs=1e-6)
    assert std.item() == pytest.approx(sd, abs=1e-7)
    # Flow-GRPO's CPS score: mean_j [-(x'_j - mu_j)^2] = mean_j [-(sd z_j)^2], no constants, no 1 / (2 sd^2)
    hand = sum(-((sd * zj) ** 2) for zj in z[0].tolist()) / 2
    assert logp.item() == pytest.approx(hand, abs=1e-5)
    # landing on s' = 0 is deterministic (std 0): x' = x0_hat and log-prob 0
    x_end, logp_end, _, std_end = cps_step(x, v, s, 0.0, eta=eta, noise=z)
    torch.testing.assert_close(x_end, x - s * v)
    assert std_end.item() == 0 and logp_end.item() == 0


def test_cps_preserves_marginal_variance_under_oracle_velocity():
    n = 400_000
    x0, eps = _randn(n, 1, seed=0), _randn(n, 1, seed=1)
    s, s_next = 0.7, 0.45
    x_s = interpolate(x0, eps, s)
    x_next, _, _, _ = cps_step(x_s, eps - x0, s, s_next, eta=0.8, generator=torch.Generator().manual_seed(2))
    target_var = (1 - s_next) ** 2 + s_next**2
    assert x_next.var().item() == pytest.approx(target_var, abs=0.01)
    # and x0 keeps its coefficient 1 - s' (the "coefficient preserving" property)
    cov = ((x_next - x_next.mean()) * (x0 - x0.mean())).mean().item()
    assert cov == pytest.approx(1 - s_next, abs=0.01)


def test_step_rejects_bad_levels():
    x = torch.zeros(SHAPE)
    with pytest.raises(ValueError, match="1 >= s > s'"):
        flow_sde_step(x, x, 0.3, 0.5, eta=0.7, s_first_next=0.9)
    with pytest.raises(ValueError, match="eta"):
        cps_step(x, x, 0.5, 0.3, eta=-1.0)


# ------------------------------------------------------------------------------------------------ loop and seeds


def test_initial_noise_is_per_seed_and_batch_invariant():
    noise, gens = initial_noise((3, 4, 4), [7, 11], device="cpu", dtype=torch.float32)
    alone, _ = initial_noise((3, 4, 4), [11], device="cpu", dtype=torch.float32)
    assert noise.shape == (2, 3, 4, 4) and len(gens) == 2
    assert torch.equal(noise[1], alone[0])
    assert torch.equal(noise[0], torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(7)))
    half, _ = initial_noise((3, 4, 4), [7], device="cpu", dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half[0], noise[0].to(torch.bfloat16))


@pytest.mark.parametrize("solver", ["flow_sde", "cps"])
def test_loop_is_batch_invariant_per_seed(solver):
    grid = sigma_grid(5, 3.0)
    x, gens = initial_noise((2, 4, 4), [3, 7, 11], device="cpu")
    batch = sample_loop(_smooth_velocity, x, grid, solver=solver, eta=0.7, generators=gens)
    x1, gens1 = initial_noise((2, 4, 4), [7], device="cpu")
    alone = sample_loop(_smooth_velocity, x1, grid, solver=solver, eta=0.7, generators=gens1)
    torch.testing.assert_close(batch.latents[1:2], alone.latents, atol=1e-6, rtol=0)
    torch.testing.assert_close(batch.log_probs[1:2], alone.log_probs, atol=1e-6, rtol=0)
    assert batch.log_probs.shape == (3, 5) and batch.timesteps_used == [0, 1, 2, 3, 4]
    x2, gens2 = initial_noise((2, 4, 4), [3, 7, 11], device="cpu")
    again = sample_loop(_smooth_velocity, x2, grid, solver=solver, eta=0.7, generators=gens2)
    assert torch.equal(again.latents, batch.latents)  # a seed fully determines the sample


def test_window_steps_are_the_only_stochastic_ones():
    grid = sigma_grid(6, 3.0)
    x, gens = initial_noise((2, 4, 4), [1, 2], device="cpu")
    seen = []
    out = sample_loop(
        _smooth_velocity,
        x,
        grid,
        solver="flow_sde",
        eta=0.7,
        generators=gens,
        return_trajectory=True,
        window=(2, 4),
        callback=lambda i, s_next, x_next: seen.append((i, s_next)),
    )
    assert out.timesteps_used == [2, 3] and out.log_probs.shape == (2, 2)
    assert [i for i, _ in seen] == list(range(6)) and seen[-1][1] == 0.0
    traj, s = out.trajectory, grid.tolist()
    for i in range(6):
        s_b = torch.full((2,), s[i])
        euler = euler_step(traj[i], _smooth_velocity(traj[i], s_b), s[i], s[i + 1])
        if i in (2, 3):
            assert (traj[i + 1] - euler).abs().max() > 1e-3
            # the stored log-prob is the one training recomputes from (x_i, x_{i+1})
            _, logp, _, _ = flow_sde_step(
                traj[i],
                _smooth_velocity(traj[i], s_b),
                s[i],
                s[i + 1],
                eta=0.7,
                s_first_next=s[1],
                x_next=traj[i + 1],
            )
            torch.testing.assert_close(logp, out.log_probs[:, i - 2])
        else:
            torch.testing.assert_close(traj[i + 1], euler, atol=0, rtol=0)


def test_loop_rejects_bad_input():
    x = torch.zeros(SHAPE)
    with pytest.raises(ValueError, match="strictly decreasing"):
        sample_loop(_smooth_velocity, x, torch.tensor([1.0, 0.5, 0.6, 0.0]))
    with pytest.raises(ValueError, match="strictly decreasing"):
        sample_loop(_smooth_velocity, x, torch.tensor([1.0, 0.5]))
    with pytest.raises(ValueError, match="unknown solver"):
        sample_loop(_smooth_velocity, x, sigma_grid(2, 1.0), solver="heun")
    with pytest.raises(ValueError, match="window"):
        sample_loop(_smooth_velocity, x, sigma_grid(2, 1.0), solver="euler", window=(0, 1))
    with pytest.raises(ValueError, match="window"):
        sample_loop(_smooth_velocity, x, sigma_grid(2, 1.0), solver="cps", window=(1, 3))
    with pytest.raises(ValueError, match="one generator per"):
        sample_loop(_smooth_velocity, x, sigma_grid(2, 1.0), solver="cps", generators=[torch.Generator()])
