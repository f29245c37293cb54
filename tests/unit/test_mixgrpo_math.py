"""MixGRPO's math (sanarl.core.mixgrpo) against Tencent-Hunyuan/MixGRPO, re-derived here with plain torch ops in
the reference's order: the progressive window of fastvideo/utils/grpo_states.py, the rebuilt grid and the mixed
rollout of fastvideo/utils/sampling_utils.py (run_sample_step with flow_grpo_step and dpm_step, "post" strategy,
DPM-Solver++ order 2 midpoint), and the group advantages of fastvideo/train_grpo_flux.py."""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.mixgrpo import (
    aggregate_advantages,
    group_advantages,
    mixgrpo_grid,
    mixgrpo_sample_loop,
    mixgrpo_window,
)
from sanarl.core.samplers import sample_loop

SHAPE = (2, 3, 3)
BATCH = 3


# ---------------------------------------------------------------------------------------------------------------
# window schedule


def _ref_windows(iterations, *, num_steps, size, interval, overlap_step, prog_overlap, roll_back):
    """GRPOTrainingStates(sample_strategy="progressive"): get_current_timesteps, then update_iteration."""
    max_timesteps = num_steps - 2
    cur, it, out = 0, 0, []
    for _ in range(iterations):
        steps = list(range(cur, min(cur + size, max_timesteps)))
        out.append(steps)
        it += 1
        if it >= interval:
            it = 0
            cur += overlap_step if prog_overlap else size
        if cur > max_timesteps:
            if roll_back:
                cur, it = 0, 0
            else:
                cur = max_timesteps
    return out


@pytest.mark.parametrize(
    ("num_steps", "size", "interval", "stride", "prog_overlap", "roll_back"),
    [
        (25, 4, 25, 1, True, True),  # finetune_flux_grpo_MixGRPO.sh
        (25, 4, 20, 1, True, True),  # finetune_flux_grpo_MixGRPO_Flash.sh
        (25, 4, 20, 0, True, True),  # the Flash* script: the window never moves
        (25, 4, 3, 4, False, True),  # without --prog_overlap the window jumps by its size
        (10, 3, 2, 2, True, False),  # no roll back: it stays at the end
        (10, 0, 1, 1, True, True),  # size 0: always empty
    ],
)
def test_window_schedule_matches_the_reference_state_machine(
    num_steps, size, interval, stride, prog_overlap, roll_back
):
    iterations = 700
    want = _ref_windows(
        iterations,
        num_steps=num_steps,
        size=size,
        interval=interval,
        overlap_step=stride,
        prog_overlap=prog_overlap,
        roll_back=roll_back,
    )
    for k in range(iterations):
        a, b = mixgrpo_window(
            k, num_steps=num_steps, size=size, interval=interval, stride=stride, roll_back=roll_back
        )
        assert list(range(a, b)) == want[k], k


def test_published_window_positions():
    w = lambda k: mixgrpo_window(k, num_steps=25, size=4, interval=25, stride=1)  # noqa: E731
    assert [w(0), w(24), w(25), w(299)] == [(0, 4), (0, 4), (1, 5), (11, 15)]
    assert [w(20 * 25), w(22 * 25), w(23 * 25), w(24 * 25)] == [(20, 23), (22, 23), (23, 23), (0, 4)]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"num_steps": 25, "size": 24, "interval": 25, "stride": 1}, "window size must be in"),
        ({"num_steps": 1, "size": 0, "interval": 25, "stride": 1}, "at least 2 steps"),
        ({"num_steps": 25, "size": 4, "interval": 0, "stride": 1}, "interval >= 1"),
    ],
)
def test_bad_windows_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        mixgrpo_window(0, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# grid and rollout


def _ref_base_grid(num_steps, shift):
    sigma_schedule = torch.linspace(1, 0, num_steps + 1)
    return (shift * sigma_schedule) / (1 + (shift - 1) * sigma_schedule)


def _ref_post_grid(sigma_schedule, last_false_index, ratio, shift):
    num_post_steps = int(max((sigma_schedule.size(0) - 1 - last_false_index) * ratio, 1))
    post_time_step = torch.linspace(1, 0, sigma_schedule.size(0))[last_false_index + 1].item()
    post = torch.linspace(post_time_step, 0, num_post_steps)
    post = (shift * post) / (1 + (shift - 1) * post)
    return torch.cat([sigma_schedule[: last_false_index + 1], post], dim=0)


@pytest.mark.parametrize(
    ("num_steps", "b", "ratio"), [(25, 4, 0.4), (25, 10, 0.2), (25, 1, 0.4), (16, 7, 0.5)]
)
def test_grid_matches_the_reference(num_steps, b, ratio):
    base = _ref_base_grid(num_steps, 3.0)
    got = mixgrpo_grid(base, num_steps=num_steps, shift=3.0, window_end=b, compress_ratio=ratio)
    want = _ref_post_grid(base, b - 1, ratio, 3.0)
    assert torch.equal(got, want)
    assert torch.equal(
        mixgrpo_grid(base, num_steps=num_steps, shift=3.0, window_end=b, compress_ratio=None), base
    )


def test_published_flash_grid_has_seven_tail_steps_after_the_first_window():
    base = _ref_base_grid(25, 3.0)
    grid = mixgrpo_grid(base, num_steps=25, shift=3.0, window_end=4, compress_ratio=0.4)
    assert grid.shape[0] - 1 == 4 + 7  # 8 tail levels: int(22 * 0.4)


def _velocity(x, s):
    """A smooth, state- and level-dependent stand-in for the transformer."""
    return torch.tanh(x) * 0.7 - 0.3 * x + s.view(-1, *([1] * (x.ndim - 1))) * 0.2


def _generators(seed):
    return [torch.Generator().manual_seed(seed * 100 + i) for i in range(BATCH)]


def _draws(seed, count):
    gens = _generators(seed)
    return [torch.stack([torch.randn(SHAPE, generator=g) for g in gens]) for _ in range(count)]


def _ref_rollout(x, sched, window, eta, dpm, noises):
    """run_sample_step (flow_grpo_sampling, post strategy when dpm), step by step."""
    a, b = window
    last = b - 1
    outputs, lower_order_nums, log_probs = [None, None], 0, []
    n_steps = sched.shape[0] - 1
    noise_iter = iter(noises)
    for i in range(n_steps):
        sigma_t = sched[i]
        pred = _velocity(x, sigma_t.expand(x.shape[0]))
        if not dpm or i <= last:
            x0 = x - sigma_t * pred
            outputs = [outputs[1], x0]
            sigma, sigma_prev, sigma_max = sched[i], sched[i + 1], sched[1].item()
            dt = sigma_prev - sigma
            std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * eta
            mean = (
                x * (1 + std_dev_t**2 / (2 * sigma) * dt)
                + pred * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
            )
            if a <= i < b:
                prev = mean + std_dev_t * torch.sqrt(-1 * dt) * next(noise_iter)
                lp = (
                    -((prev.detach() - mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))
                    - torch.log(std_dev_t * torch.sqrt(-1 * dt))
                    - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
                )
                log_probs.append(lp.mean(dim=tuple(range(1, lp.ndim))))
            else:
                prev = x + dt * pred
            lower_order_nums = min(lower_order_nums + 1, 2)
            x = prev
            continue
        m0 = x - sigma_t * pred
        outputs = [outputs[1], m0]
        lower_order_final = i == n_steps - 1
        s_t, s_0 = sched[i + 1], sched[i]
        alpha_t, alpha_0 = 1 - s_t, 1 - s_0
        lambda_t, lambda_0 = torch.log(alpha_t) - torch.log(s_t), torch.log(alpha_0) - torch.log(s_0)
        h = lambda_t - lambda_0
        if lower_order_nums < 1 or lower_order_final:
            x = (s_t / s_0) * x - (alpha_t * (torch.exp(-h) - 1.0)) * m0
        else:
            s_1 = sched[i - 1]
            lambda_1 = torch.log(1 - s_1) - torch.log(s_1)
            r0 = (lambda_0 - lambda_1) / h
            d1 = (1.0 / r0) * (m0 - outputs[0])
            x = (
                (s_t / s_0) * x
                - (alpha_t * (torch.exp(-h) - 1.0)) * m0
                - 0.5 * (alpha_t * (torch.exp(-h) - 1.0)) * d1
            )
        lower_order_nums = min(lower_order_nums + 1, 2)
    return x, (torch.stack(log_probs, dim=1) if log_probs else None)


@pytest.mark.parametrize(
    ("num_steps", "window", "ratio"),
    [
        (12, (0, 3), 0.4),
        (12, (4, 7), 0.4),
        (25, (2, 6), 0.2),
        (25, (11, 15), 0.4),
        (12, (3, 6), None),
        (12, (0, 10), None),
    ],
)
def test_rollout_matches_the_reference(num_steps, window, ratio):
    base = _ref_base_grid(num_steps, 3.0)
    grid = mixgrpo_grid(base, num_steps=num_steps, shift=3.0, window_end=window[1], compress_ratio=ratio)
    x_init = torch.randn(BATCH, *SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = mixgrpo_sample_loop(
            _velocity,
            x_init,
            grid,
            window=window,
            eta=0.7,
            dpm_tail=ratio is not None,
            generators=_generators(2),
        )
        want_x, want_lp = _ref_rollout(
            x_init, grid, window, 0.7, ratio is not None, _draws(2, window[1] - window[0])
        )
    torch.testing.assert_close(out.latents, want_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.log_probs, want_lp, rtol=1e-5, atol=1e-5)
    assert out.timesteps_used == list(range(*window))


def test_dpm_tail_uses_the_second_order_correction():
    base = _ref_base_grid(12, 3.0)
    grid = mixgrpo_grid(base, num_steps=12, shift=3.0, window_end=3, compress_ratio=0.5)
    x_init = torch.randn(BATCH, *SHAPE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        dpm = mixgrpo_sample_loop(
            _velocity, x_init, grid, window=(0, 3), eta=0.7, dpm_tail=True, generators=_generators(4)
        )
        euler = mixgrpo_sample_loop(
            _velocity, x_init, grid, window=(0, 3), eta=0.7, dpm_tail=False, generators=_generators(4)
        )
    assert float((dpm.latents - euler.latents).abs().max()) > 1e-3
    torch.testing.assert_close(dpm.log_probs, euler.log_probs, rtol=0, atol=0)


def test_empty_window_is_the_euler_sampler_and_full_window_is_flow_grpo():
    grid = _ref_base_grid(8, 3.0)
    x_init = torch.randn(BATCH, *SHAPE, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ode = mixgrpo_sample_loop(_velocity, x_init, grid, window=(3, 3), eta=0.7, dpm_tail=False)
        ref_ode = sample_loop(_velocity, x_init, grid, solver="euler")
        full = mixgrpo_sample_loop(
            _velocity, x_init, grid, window=(0, 8), eta=0.7, dpm_tail=False, generators=_generators(6)
        )
        ref_full = sample_loop(_velocity, x_init, grid, solver="flow_sde", eta=0.7, generators=_generators(6))
        part = mixgrpo_sample_loop(
            _velocity, x_init, grid, window=(2, 5), eta=0.7, dpm_tail=False, generators=_generators(7)
        )
        ref_part = sample_loop(
            _velocity, x_init, grid, solver="flow_sde", eta=0.7, generators=_generators(7), window=(2, 5)
        )
    assert ode.log_probs is None and torch.equal(ode.latents, ref_ode.latents)
    assert torch.equal(full.latents, ref_full.latents) and torch.equal(full.log_probs, ref_full.log_probs)
    assert torch.equal(part.latents, ref_part.latents) and torch.equal(part.log_probs, ref_part.log_probs)


def test_rollout_refuses_a_window_outside_the_grid():
    grid = _ref_base_grid(4, 3.0)
    with pytest.raises(ValueError, match="window"):
        mixgrpo_sample_loop(_velocity, torch.zeros(1, *SHAPE), grid, window=(2, 6), eta=0.7, dpm_tail=False)


# ---------------------------------------------------------------------------------------------------------------
# advantages


def _ref_group_advantages(rewards, num_generations):
    n = len(rewards) // num_generations
    advantages = torch.zeros_like(rewards)
    for i in range(n):
        group_rewards = rewards[i * num_generations : (i + 1) * num_generations]
        group_mean = group_rewards.mean()
        group_std = group_rewards.std() + 1e-8
        advantages[i * num_generations : (i + 1) * num_generations] = (group_rewards - group_mean) / group_std
    return advantages


@pytest.mark.parametrize("group_size", [2, 4, 12])
def test_group_advantages_match_the_reference(group_size):
    g = torch.Generator().manual_seed(group_size)
    rewards = torch.randn(group_size * 3, generator=g, dtype=torch.float64)
    assert torch.equal(group_advantages(rewards, group_size), _ref_group_advantages(rewards, group_size))


def test_advantage_aggregation_matches_the_reference():
    g = torch.Generator().manual_seed(9)
    rewards = {k: torch.randn(8, generator=g, dtype=torch.float64) for k in ("hps", "clip", "pick")}
    weights = {"hps": 1.0, "clip": 0.5, "pick": 2.0}
    merged = torch.zeros_like(rewards["hps"])
    for name, r in rewards.items():
        merged += _ref_group_advantages(r, 4) * weights[name]
    assert torch.equal(aggregate_advantages(rewards, weights, 4), merged)


def test_equal_rewards_give_zero_advantages():
    assert group_advantages(torch.full((6,), 0.3), 3).tolist() == [0.0] * 6


def test_a_tail_that_would_hold_one_level_still_reaches_zero():
    # N = 25, window ending at b = 23, r = 0.4: int(max(3 * 0.4, 1)) = 1, so the reference's tail is the single
    # level s_23 and its rollout stops there; sanarl's tail keeps 2 levels
    # (docs/algorithms.md, "Deliberate differences")
    base = _ref_base_grid(25, 3.0)
    want_ref = _ref_post_grid(base, 22, 0.4, 3.0)
    assert want_ref.shape[0] == 24 and float(want_ref[-1]) > 0.2
    got = mixgrpo_grid(base, num_steps=25, shift=3.0, window_end=23, compress_ratio=0.4)
    assert got.shape[0] == 25 and float(got[-1]) == 0.0
    assert torch.equal(got[:24], want_ref)
