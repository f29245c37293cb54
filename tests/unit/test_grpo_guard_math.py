"""GRPO-Guard's math (sanarl.core.grpo_guard) against X-GenGroup/Flow-Factory (trainers/grpo.py GRPOGuardTrainer
.optimize and the Flow-SDE branch of scheduler/flow_match_euler_discrete.py), re-derived here with plain torch ops
in the reference's order, values and gradients, on steps of sanarl's own flow_sde sampler."""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.grpo_guard import guard_clip_loss, guard_log_ratio
from sanarl.core.grpo_loss import ppo_clip_loss
from sanarl.core.samplers import flow_sde_step

SHAPE = (4, 3, 3)
S_FIRST_NEXT = 0.96


def _step(seed, s, s_next, eta, drift):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, *SHAPE, generator=g)
    v_old = torch.randn(3, *SHAPE, generator=g)
    noise = torch.randn(3, *SHAPE, generator=g)
    x_next, old_lp, old_mean, std = flow_sde_step(
        x, v_old, s, s_next, eta=eta, s_first_next=S_FIRST_NEXT, noise=noise
    )
    v = (v_old + drift * torch.randn(3, *SHAPE, generator=g)).requires_grad_(True)
    return x, v_old, v, x_next, old_lp, old_mean, std, noise


def _ff_forward(x, v, s, s_next, eta, next_latents):
    """The Flow-SDE step of Flow-Factory's scheduler (sigma_max = the grid's second level)."""
    sigma, sigma_prev = torch.tensor(s), torch.tensor(s_next)
    dt = sigma_prev - sigma
    std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1.0, torch.tensor(S_FIRST_NEXT), sigma))) * eta
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    std_variance = std_dev_t * torch.sqrt(-1 * dt)
    log_prob = (
        -((next_latents.detach() - mean) ** 2) / (2 * std_variance**2)
        - torch.log(std_variance)
        - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
    )
    return log_prob.mean(dim=tuple(range(1, log_prob.ndim))), mean, std_dev_t, dt


def _ff_loss(x, v, s, s_next, eta, next_latents, old_log_prob, old_mean, adv, clip):
    """GRPOGuardTrainer.optimize, steps 3 (advantages clipped to (-5, 5))."""
    log_prob, mean, std_dev_t, dt = _ff_forward(x, v, s, s_next, eta, next_latents)
    adv = torch.clamp(adv, -5.0, 5.0)
    scale_factor = torch.sqrt(-dt) * std_dev_t
    mse = (mean - old_mean).flatten(1).pow(2).mean(dim=1)
    ratio = torch.exp((log_prob - old_log_prob) * scale_factor + mse / (2 * scale_factor))
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 + clip[0], 1.0 + clip[1])
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss)), ratio


def _ours(x, v, s, s_next, eta, x_next, old_lp, old_mean, adv, clip):
    _, lp, mean, std = flow_sde_step(x, v, s, s_next, eta=eta, s_first_next=S_FIRST_NEXT, x_next=x_next)
    trans = std * math.sqrt(s - s_next)
    log_ratio = guard_log_ratio(lp, old_lp, mean, old_mean, trans)
    return guard_clip_loss(log_ratio, adv.clamp(-5.0, 5.0), clip[0], clip[1]), log_ratio


@pytest.mark.parametrize(
    ("s", "s_next", "eta", "drift", "clip"),
    [
        (1.0, 0.96, 0.7, 0.05, (-1e-4, 1e-4)),
        (0.75, 0.6, 0.7, 0.05, (-0.2, 0.3)),
        (0.3, 0.2, 1.0, 0.02, (-0.5, 0.5)),
        (0.08, 0.02, 0.7, 0.01, (-1e-4, 1e-4)),
    ],
)
def test_guard_loss_matches_the_reference_values_and_gradients(s, s_next, eta, drift, clip):
    x, _, v, x_next, old_lp, old_mean, _, _ = _step(int(s * 100), s, s_next, eta, drift)
    adv = torch.tensor([1.3, -0.4, 7.0])
    (loss, metrics), _ = _ours(x, v, s, s_next, eta, x_next, old_lp, old_mean, adv, clip)
    (g_got,) = torch.autograd.grad(loss, v)
    v_ref = v.detach().clone().requires_grad_(True)
    want, ratio = _ff_loss(x, v_ref, s, s_next, eta, x_next, old_lp, old_mean, adv, clip)
    (g_want,) = torch.autograd.grad(want, v_ref)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-8)
    assert float(metrics["clip_frac_high"]) == float((ratio > 1.0 + clip[1]).float().mean())
    assert float(metrics["clip_frac_low"]) == float((ratio < 1.0 + clip[0]).float().mean())


@pytest.mark.parametrize(("s", "s_next"), [(0.9, 0.8), (0.2, 0.1)])
def test_guard_log_ratio_is_the_noise_projection_of_the_mean_shift(s, s_next):
    # with x' = mu_old + sigma z: sigma (logp - logp_old) + |dmu|^2 / (2 sigma) = mean(z (mu - mu_old))
    x, _, v, x_next, old_lp, old_mean, std, noise = _step(3, s, s_next, 0.7, 0.2)
    _, lp, mean, _ = flow_sde_step(x, v, s, s_next, eta=0.7, s_first_next=S_FIRST_NEXT, x_next=x_next)
    trans = std * math.sqrt(s - s_next)
    got = guard_log_ratio(lp, old_lp, mean, old_mean, trans)
    want = (noise * (mean - old_mean)).flatten(1).mean(dim=1)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-6)


def test_on_policy_guard_is_plain_grpo_reweighted_by_the_transition_std():
    # ratio 1 everywhere: the loss value is Flow-GRPO's; each sample's gradient is sigma times Flow-GRPO's
    s, s_next = 0.5, 0.4
    x, v_old, _, x_next, old_lp, old_mean, std, _ = _step(5, s, s_next, 0.7, 0.0)
    adv = torch.tensor([0.7, -1.2, 0.3])
    v = v_old.clone().requires_grad_(True)
    (guard, metrics), log_ratio = _ours(x, v, s, s_next, 0.7, x_next, old_lp, old_mean, adv, (-1e-4, 1e-4))
    assert float(log_ratio.detach().abs().max()) == 0.0 and float(metrics["ratio_mean"]) == 1.0
    v2 = v_old.clone().requires_grad_(True)
    _, lp, _, _ = flow_sde_step(x, v2, s, s_next, eta=0.7, s_first_next=S_FIRST_NEXT, x_next=x_next)
    plain, _ = ppo_clip_loss(lp, old_lp, adv, 1e-4)
    assert float(guard.detach()) == float(plain.detach()) == pytest.approx(-float(adv.mean()))
    (g_guard,) = torch.autograd.grad(guard, v)
    (g_plain,) = torch.autograd.grad(plain, v2)
    sigma = float(std[0]) * math.sqrt(s - s_next)
    torch.testing.assert_close(g_guard, sigma * g_plain, rtol=1e-5, atol=1e-9)


def test_guard_ratio_mean_is_unbiased_where_the_plain_ratio_is_not():
    # many independent draws of x' under a fixed mean shift: the plain log-ratio averages -|dmu|^2 / (2 sigma^2),
    # the Guard log-ratio averages 0
    s, s_next = 0.1, 0.05
    guard, plain = [], []
    for seed in range(200):
        x, _, v, x_next, old_lp, old_mean, std, _ = _step(seed, s, s_next, 0.7, 0.05)
        _, lp, mean, _ = flow_sde_step(
            x, v.detach(), s, s_next, eta=0.7, s_first_next=S_FIRST_NEXT, x_next=x_next
        )
        plain.append((lp - old_lp).mean())
        guard.append(guard_log_ratio(lp, old_lp, mean, old_mean, std * math.sqrt(s - s_next)).mean())
    plain_mean, guard_mean = float(torch.stack(plain).mean()), float(torch.stack(guard).mean())
    assert plain_mean < -10 * abs(guard_mean)
    assert abs(guard_mean) < 1e-3


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: guard_clip_loss(torch.zeros(2), torch.zeros(2), 0.1, 0.2), "low < 0 < high"),
        (
            lambda: guard_log_ratio(
                torch.zeros(2), torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2)
            ),
            "std > 0",
        ),
        (
            lambda: guard_log_ratio(
                torch.zeros(2), torch.zeros(3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2)
            ),
            "old_log_prob",
        ),
    ],
)
def test_bad_arguments_name_what_is_wrong(call, words):
    with pytest.raises(ValueError, match=words):
        call()
