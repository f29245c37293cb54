"""AWM's math (sanarl.core.awm_loss) against the authors' formulas (scxue/advantage_weighted_matching,
scripts/train_sd3_awm.py: compute_log_prob_awm, the time_type branches, the PPO block, the KL block), each
re-derived here with plain torch ops in the reference's order, values and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sanarl.core.advantages import PerPromptStatTracker
from sanarl.core.awm_loss import (
    awm_advantages,
    awm_kl_ema_decay,
    awm_log_prob,
    awm_policy_loss,
    awm_train_step_indices,
    awm_velocity_kl,
)

GHUBER_P = 0.25


def _batch(seed: int, n: int = 6, shape=(3, 4, 4)):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(n, *shape, generator=g)
    eps = torch.randn(n, *shape, generator=g)
    v = torch.randn(n, *shape, generator=g).requires_grad_(True)
    s = torch.rand(n, generator=g) * 0.9 + 0.05
    return v, x0, eps, s


def _ref_log_prob(v, x0, eps, s, weighting):
    """compute_log_prob_awm after the forward, written out."""
    model_output = v.double()
    log_prob = -((model_output - (eps.double() - x0.double())) ** 2)
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    t = s.double().view(-1)
    if weighting == "t":
        return log_prob * t
    if weighting == "t2":
        return log_prob * t**2
    if weighting == "uniform":
        return log_prob
    if weighting == "huber":
        return -(torch.sqrt(-log_prob + 1e-10) - 1e-5) * t
    floor = torch.pow(torch.tensor(1e-10, dtype=log_prob.dtype), GHUBER_P)
    return -(torch.pow(-log_prob + 1e-10, GHUBER_P) - floor) * t / GHUBER_P


@pytest.mark.parametrize("weighting", ["uniform", "t", "t2", "huber", "ghuber"])
@pytest.mark.parametrize("seed", [0, 1])
def test_log_prob_matches_reference_values_and_gradients(weighting, seed):
    v, x0, eps, s = _batch(seed)
    got = awm_log_prob(v, x0, eps, s, weighting=weighting, ghuber_power=GHUBER_P)
    w = torch.randn(v.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 9))
    (g_got,) = torch.autograd.grad((got * w).sum(), v)
    v_ref = v.detach().clone().requires_grad_(True)
    want = _ref_log_prob(v_ref, x0, eps, s, weighting)
    (g_want,) = torch.autograd.grad((want * w).sum(), v_ref)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-15)


def test_log_prob_is_minus_the_flow_matching_error_and_zero_at_the_oracle():
    v, x0, eps, s = _batch(3)
    x0, eps = x0.double(), eps.double()
    oracle = (eps - x0).requires_grad_(True)
    assert torch.equal(awm_log_prob(oracle, x0, eps, s), torch.zeros(6, dtype=torch.float64))
    # ghuber is 0 at the oracle too (its floor term cancels the 1e-10 offset)
    assert torch.allclose(
        awm_log_prob(oracle, x0, eps, s, weighting="ghuber"), torch.zeros(6, dtype=torch.float64)
    )
    err = ((v.detach().double() - (eps - x0)) ** 2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(awm_log_prob(v, x0, eps, s), -err, rtol=1e-15, atol=0)


def _ref_indices(scheme, num_train, num_steps, fraction, seed):
    """The three discrete time_type branches, torch.rand drawn from a generator seeded like the one under test."""
    g = torch.Generator().manual_seed(seed)
    if scheme == "discrete":
        boundaries = torch.linspace(0, int(num_steps * fraction), steps=num_train + 1)
        lower, upper = boundaries[:-1].long(), boundaries[1:].long()
        return lower + (torch.rand(num_train, generator=g) * (upper - lower)).long()
    if scheme == "discrete_wo_init":
        boundaries = torch.linspace(1, int(num_steps * fraction), steps=num_train + 1)
        lower, upper = boundaries[:-1].long(), boundaries[1:].long()
        return lower + (torch.rand(num_train, generator=g) * (upper - lower)).long()
    init = torch.tensor([0], dtype=torch.long)
    remaining = num_train - 1
    if remaining == 0:
        return init
    boundaries = torch.linspace(1, int(num_steps * fraction), steps=remaining + 1)
    lower, upper = boundaries[:-1].long(), boundaries[1:].long()
    return torch.cat([init, lower + (torch.rand(remaining, generator=g) * (upper - lower)).long()])


@pytest.mark.parametrize("scheme", ["discrete", "discrete_wo_init", "discrete_with_init"])
@pytest.mark.parametrize(
    ("num_train", "num_steps", "fraction"), [(6, 14, 0.9), (3, 10, 1.0), (1, 14, 0.9), (4, 40, 0.5)]
)
def test_train_step_indices_match_reference(scheme, num_train, num_steps, fraction):
    for seed in range(5):
        got = awm_train_step_indices(
            num_train, num_steps, fraction, scheme=scheme, generator=torch.Generator().manual_seed(seed)
        )
        want = _ref_indices(scheme, num_train, num_steps, fraction, seed)
        assert torch.equal(got, want)


def test_published_steps_never_train_the_pure_noise_step():
    # The published SD3.5-M recipe: 14 sample steps, train_timesteps 6, timestep_fraction 0.9, discrete_wo_init.
    seen = set()
    for seed in range(200):
        idx = awm_train_step_indices(6, 14, 0.9, generator=torch.Generator().manual_seed(seed))
        assert idx.tolist() == sorted(idx.tolist())
        seen.update(idx.tolist())
    assert seen == set(range(1, 12))  # strata of [1, 12]: 12 itself is never drawn (u < 1)


def _ref_policy_loss(log_probs, old_log_probs, adv_raw, clip_range, adv_clip_max, advantage_max, loss_type):
    advantages = torch.clamp(adv_raw, -adv_clip_max, adv_clip_max)
    if advantage_max is not None:
        advantages = advantages / adv_clip_max * advantage_max
    T = log_probs.shape[0]
    if loss_type == "sum_first":
        ratio = torch.exp(log_probs.mean(dim=0) - old_log_probs.mean(dim=0).detach())
    else:
        ratio = torch.exp(log_probs.view(-1) - old_log_probs.view(-1).detach())
        advantages = advantages.unsqueeze(0).repeat(T, 1).view(-1)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss))


@pytest.mark.parametrize("loss_type", ["exp_first", "sum_first"])
@pytest.mark.parametrize(("clip_range", "advantage_max"), [(1.0, 1.0), (1e-4, None), (0.05, 2.0)])
def test_policy_loss_matches_reference(loss_type, clip_range, advantage_max):
    g = torch.Generator().manual_seed(7)
    T, B = 3, 5
    lp = (torch.randn(T, B, generator=g, dtype=torch.float64) * 0.1).requires_grad_(True)
    old = lp.detach() + torch.randn(T, B, generator=g, dtype=torch.float64) * 0.2
    adv_raw = torch.randn(B, generator=g, dtype=torch.float64) * 4
    got, metrics = awm_policy_loss(
        lp, old, awm_advantages(adv_raw, 5.0, advantage_max), clip_range=clip_range, loss_type=loss_type
    )
    (g_got,) = torch.autograd.grad(got, lp)
    lp_ref = lp.detach().clone().requires_grad_(True)
    want = _ref_policy_loss(lp_ref, old, adv_raw, clip_range, 5.0, advantage_max, loss_type)
    (g_want,) = torch.autograd.grad(want, lp_ref)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=0)
    if clip_range == 1e-4:
        assert float(metrics["clip_frac"]) > 0.5


def test_advantage_rescale_maps_the_clip_range_onto_advantage_max():
    a = torch.tensor([-9.0, -5.0, -1.0, 0.0, 2.5, 7.0], dtype=torch.float64)
    assert awm_advantages(a, 5.0, 1.0).tolist() == [-1.0, -1.0, -0.2, 0.0, 0.5, 1.0]
    assert awm_advantages(a, 5.0, None).tolist() == [-5.0, -5.0, -1.0, 0.0, 2.5, 5.0]


def test_on_policy_gradient_is_the_advantage_weighted_flow_matching_gradient():
    v, x0, eps, s = _batch(11, n=4)
    adv = torch.tensor([0.5, -1.0, 0.25, 2.0], dtype=torch.float64)
    lp = awm_log_prob(v, x0, eps, s).reshape(1, 4)
    loss, metrics = awm_policy_loss(lp, lp.detach(), adv, clip_range=1.0)
    assert float(metrics["ratio_mean"]) == 1.0
    assert float(loss.detach()) == pytest.approx(-float(adv.mean()), abs=1e-15)
    (g,) = torch.autograd.grad(loss, v)
    # d/dv of mean_b A_b mse_b: 2 A_b (v - v*) / (numel per sample) / B
    want = 2 * adv.view(-1, 1, 1, 1) * (v.detach().double() - (eps - x0).double()) / (3 * 16) / 4
    torch.testing.assert_close(g.double(), want, rtol=1e-6, atol=1e-9)


def test_all_equal_advantages_train_plain_flow_matching_or_nothing():
    v, x0, eps, s = _batch(12, n=4)
    lp = awm_log_prob(v, x0, eps, s).reshape(1, 4)
    zero, _ = awm_policy_loss(lp, lp.detach(), torch.zeros(4, dtype=torch.float64), clip_range=1.0)
    (g0,) = torch.autograd.grad(zero, v, retain_graph=True)
    assert float(zero.detach()) == 0.0 and float(g0.abs().max()) == 0.0
    lp2 = awm_log_prob(v, x0, eps, s).reshape(1, 4)
    ones, _ = awm_policy_loss(lp2, lp2.detach(), torch.full((4,), 0.3, dtype=torch.float64), clip_range=1.0)
    (g1,) = torch.autograd.grad(ones, v)
    v2 = v.detach().clone().requires_grad_(True)
    mse = ((v2 - (eps - x0)) ** 2).mean()
    (g_fm,) = torch.autograd.grad(0.3 * mse, v2)
    torch.testing.assert_close(g1, g_fm, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("weight", ["uniform", "elbo"])
def test_velocity_kl_matches_reference(weight):
    g = torch.Generator().manual_seed(5)
    T, B = 2, 3
    v = torch.randn(T * B, 4, 2, 2, generator=g, dtype=torch.float64).requires_grad_(True)
    v_ref = torch.randn(T * B, 4, 2, 2, generator=g, dtype=torch.float64)
    s = torch.cat([torch.full((B,), 0.995, dtype=torch.float64), torch.full((B,), 0.4, dtype=torch.float64)])
    got = awm_velocity_kl(v, v_ref, s, weight=weight)
    (g_got,) = torch.autograd.grad(got, v)
    # reference: [T, B, C, H, W] tensors, std_dev_t [T, B, 1, 1, 1] from compute_log_prob_awm
    vv = v.detach().clone().requires_grad_(True)
    model_output, model_output_ref = vv.reshape(T, B, 4, 2, 2), v_ref.reshape(T, B, 4, 2, 2)
    sigma = s.view(-1, 1, 1, 1)
    std_dev_t = (torch.sqrt(sigma / (1 - torch.clamp(sigma, 0, 0.99))) * 0.7).reshape(T, B, 1, 1, 1)
    kl_loss = ((model_output - model_output_ref) ** 2).mean(dim=(2, 3, 4), keepdim=True)
    if weight == "elbo":
        kl_loss = kl_loss / (2 * std_dev_t**2)
    want = kl_loss.mean(dim=0).mean()
    (g_want,) = torch.autograd.grad(want, vv)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    torch.testing.assert_close(g_got, g_want, rtol=1e-14, atol=0)


def test_velocity_kl_is_zero_at_the_reference():
    v = torch.randn(3, 2, 2, 2)
    assert float(awm_velocity_kl(v, v.clone(), 0.5, weight="elbo")) == 0.0


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda: awm_log_prob(
                torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), 0.5, weighting="l1"
            ),
            "weighting",
        ),
        (lambda: awm_train_step_indices(6, 14, 0.0), "fraction"),
        (lambda: awm_train_step_indices(6, 14, 0.9, scheme="logit"), "scheme"),
        (
            lambda: awm_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), clip_range=1.0),
            "adv [B]",
        ),
        (
            lambda: awm_policy_loss(
                torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(3), clip_range=1.0, loss_type="x"
            ),
            "loss_type",
        ),
        (lambda: awm_advantages(torch.zeros(3), 0.0, 1.0), "adv_clip_max"),
    ],
)
def test_bad_arguments_name_what_is_wrong(call, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_log_two_pi_free():
    # the surrogate carries no Gaussian constant: a unit error gives exactly -1 under uniform weighting
    x0 = torch.zeros(1, 2, 2)
    eps = torch.ones(1, 2, 2)
    v = torch.zeros(1, 2, 2)
    assert float(awm_log_prob(v, x0, eps, 0.5)) == -1.0
    assert float(awm_log_prob(v, x0, eps, 0.5, weighting="huber")) == pytest.approx(
        -(math.sqrt(1 + 1e-10) - 1e-5) * 0.5
    )


def test_kl_ema_decay_follows_the_reference_schedule():
    for step in (0, 1, 150, 299, 300, 301, 5000):
        assert awm_kl_ema_decay(step, 0.3) == min(0.3, 0.001 * step)
        assert awm_kl_ema_decay(step, 0.3, "constant") == 0.3
    # one update of the reference's loop: tgt = tgt d + src (1 - d)
    ema, theta, d = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5]), awm_kl_ema_decay(200, 0.3)
    assert d == pytest.approx(0.2) and torch.allclose(ema * d + theta * (1 - d), torch.tensor([2.6, 0.0]))
    assert awm_kl_ema_decay(0, 0.3) == 0.0  # the first update copies the policy


def test_awm_advantages_are_the_per_prompt_tracker_with_global_std():
    # flow_grpo/stat_tracking.py PerPromptStatTracker(global_std=True).update, written out with numpy
    prompts = ["a", "b", "a", "c", "b", "a", "c", "c"]
    rewards = np.array([0.1, 0.9, 0.4, 0.3, 0.2, 0.8, 0.3, 0.5], dtype=np.float64)
    arr = np.array(prompts)
    want = np.empty_like(rewards) * 0.0
    for prompt in np.unique(arr):
        group = rewards[arr == prompt]
        want[arr == prompt] = (group - np.mean(group, axis=0, keepdims=True)) / (
            np.std(rewards, axis=0, keepdims=True) + 1e-4
        )
    got = PerPromptStatTracker(global_std=True).compute(prompts, torch.tensor(rewards))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
