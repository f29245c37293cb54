"""DDRL's loss and step selection (docs/algorithms.md, "DDRL"), re-derived here element by element in float64 from
the formulas, never by calling the function under test: the value and the gradients of the policy (clip active on
some rows, exp reward), KL and data terms, Cosmos-RL's data-term weight (its EDM x0 loss) and loss scale under the
gradient-norm clip, its per-group advantage normaliser, and `train_on` with random (-1) entries."""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.advantages import PerPromptStatTracker
from sanarl.core.ddrl import data_weight, ddrl_advantages, ddrl_loss, select_train_on

B, SHAPE = 4, (2, 2, 2)
E = 8  # elements per sample


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _reference(
    logp, old, adv_raw, clip, kl_beta, mean, mean_ref, std, data_beta, v, x0, eps, low, high, exp_reward=True
):
    """Value and gradients (d/dlogp, d/dmean, d/dv) from the formulas, one sample and one element at a time."""
    loss, g_logp = 0.0, [0.0] * B
    g_mean, g_v = torch.zeros_like(mean), torch.zeros_like(v)
    for b in range(B):
        raw = float(adv_raw[b])
        a = min(max(-math.exp(-raw) if exp_reward else raw, low), high)  # lambda(A) = -exp(-A), then the clip
        r = math.exp(float(logp[b]) - float(old[b]))
        rc = min(max(r, 1 - clip), 1 + clip)
        unclipped, clipped = -a * r, -a * rc
        loss += max(unclipped, clipped) / B
        # the clipped branch is constant in logp unless r lies inside the range (then both branches are -a r)
        g_logp[b] = (-a * r / B) if (unclipped >= clipped or 1 - clip <= r <= 1 + clip) else 0.0
        for e in range(E):
            idx = (b, *torch.unravel_index(torch.tensor(e), SHAPE))
            d_mu = float(mean[idx] - mean_ref[idx])
            loss += kl_beta * d_mu**2 / (2 * float(std[b]) ** 2) / (E * B)
            g_mean[idx] = kl_beta * 2 * d_mu / (2 * float(std[b]) ** 2) / (E * B)
            d_v = float(v[idx] - (eps[idx] - x0[idx]))
            loss += data_beta * d_v**2 / (E * B)
            g_v[idx] = data_beta * 2 * d_v / (E * B)
    return loss, torch.tensor(g_logp, dtype=torch.float64), g_mean, g_v


def test_ddrl_loss_value_and_gradients_match_the_formulas_with_the_clip_active_and_exp_reward():
    clip, kl_beta, data_beta, low, high = 0.05, 0.3, 0.7, -5.0, 5.0
    old = _rand(0, B)
    # rows 0 and 1 move beyond the clip range (one each way), rows 2 and 3 stay inside it
    logp = (old + torch.tensor([0.2, -0.2, 0.01, -0.02], dtype=torch.float64)).requires_grad_()
    # raw advantages of both signs; -exp(2) = -7.39 is clipped to -5
    adv_raw = torch.tensor([0.8, -0.5, -2.0, 1.5], dtype=torch.float64)
    mean = _rand(1, B, *SHAPE).requires_grad_()
    mean_ref, std = _rand(2, B, *SHAPE), torch.tensor([0.3, 0.5, 0.7, 0.9], dtype=torch.float64)
    v, x0, eps = _rand(3, B, *SHAPE).requires_grad_(), _rand(4, B, *SHAPE), _rand(5, B, *SHAPE)

    adv = ddrl_advantages(adv_raw, True, low, high)
    loss, metrics = ddrl_loss(
        logp, old, adv, clip, kl_beta=kl_beta, mean=mean, mean_ref=mean_ref, std=std, data_beta=data_beta,
        v_data=v, x0=x0, eps=eps,
    )  # fmt: skip
    loss.backward()
    want, g_logp, g_mean, g_v = _reference(
        logp.detach(), old, adv_raw, clip, kl_beta, mean.detach(), mean_ref, std, data_beta, v.detach(), x0, eps,
        low, high,
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(logp.grad, g_logp, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(mean.grad, g_mean, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(v.grad, g_v, rtol=1e-10, atol=1e-14)
    # the clip acts: the row whose ratio left the range in the direction its advantage rewards gets no gradient
    assert (logp.grad == 0).any() and (logp.grad != 0).sum() >= 2
    assert float(metrics["clip_frac"]) == pytest.approx(0.5)
    assert float(metrics["data_loss"]) > 0 and float(metrics["kl"]) > 0


def test_without_kl_and_data_the_loss_is_flow_grpos_policy_term_and_the_identity_advantage_is_only_clipped():
    old, clip = _rand(6, B), 1e-3
    logp = (old + 0.01).requires_grad_()
    adv_raw = torch.tensor([7.0, -0.5, 0.2, -9.0], dtype=torch.float64)
    adv = ddrl_advantages(adv_raw, False, -5.0, 5.0)
    assert adv.tolist() == [5.0, -0.5, 0.2, -5.0]
    loss, metrics = ddrl_loss(logp, old, adv, clip)
    r = math.exp(0.01)
    want = sum(max(-a * r, -a * min(max(r, 1 - clip), 1 + clip)) for a in adv.tolist()) / B
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    assert float(metrics["kl"]) == 0 and float(metrics["data_loss"]) == 0


def test_train_on_keeps_the_listed_steps_and_draws_each_minus_one_from_the_others_without_replacement():
    candidates = list(range(10))
    seen: set[int] = set()
    for seed in range(200):
        steps = select_train_on([6, 0, -1, -1], candidates, torch.Generator().manual_seed(seed))
        assert steps == sorted(steps) and len(set(steps)) == 4
        assert {0, 6} <= set(steps)
        extra = set(steps) - {0, 6}
        assert len(extra) == 2 and extra <= set(candidates) - {0, 6}
        seen |= extra
    assert seen == set(candidates) - {0, 6}  # every other step is drawn at some point
    # the draw is a pure function of the generator, and explicit steps alone are returned sorted
    a = select_train_on([-1, 3], candidates, torch.Generator().manual_seed(7))
    assert a == select_train_on([-1, 3], candidates, torch.Generator().manual_seed(7))
    assert select_train_on([8, 2, 4], candidates, torch.Generator()) == [2, 4, 8]


def test_train_on_refuses_steps_without_a_random_transition_and_too_many_random_entries():
    cps_candidates = list(range(9))  # cps on 10 steps: the last step lands on s' = 0 deterministically
    with pytest.raises(ValueError, match="distinct steps among the random ones"):
        select_train_on([9], cps_candidates, torch.Generator())
    with pytest.raises(ValueError, match="distinct"):
        select_train_on([1, 1], cps_candidates, torch.Generator())
    with pytest.raises(ValueError, match="random steps but only 1 remain"):
        select_train_on([0, 1, 2, 3, 4, 5, 6, 7, -1, -1], cps_candidates, torch.Generator())


def _cosmos_rl_data_loss(
    F: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    """Cosmos-RL's data loss (`compute_loss_with_epsilon_and_sigma`, then `.mean()`) for a network output `F` at the
    rectified-flow input of level s: EDM sigma = s / (1 - s), x_t = x0 + sigma eps, t = sigma / (1 + sigma),
    c_skip = c_in = 1 - t, c_out = -t, x0_hat = c_skip x_t + c_out F, weight (sigma^2 + sigma_data^2) /
    (sigma sigma_data)^2 with sigma_data = 1."""
    sigma = (s / (1 - s)).view(-1, 1, 1, 1)
    x_t = x0 + sigma * eps
    t = sigma / (1 + sigma)
    x0_hat = (1 - t) * x_t + (-t) * F
    weight = (sigma**2 + 1.0) / (sigma * 1.0) ** 2
    return (weight * (x0 - x0_hat) ** 2).mean()


def test_the_default_data_term_is_cosmos_rls_edm_x0_loss_in_value_and_gradient():
    s = torch.tensor([0.1, 0.3, 0.5, 0.93], dtype=torch.float64)
    x0, eps = _rand(10, B, *SHAPE), _rand(11, B, *SHAPE)
    # the network's input is the rectified-flow point both codebases feed it: c_in x_t = (1 - s) x0 + s eps
    sigma = (s / (1 - s)).view(-1, 1, 1, 1)
    torch.testing.assert_close(
        (x0 + sigma * eps) / (1 + sigma), (1 - s.view(-1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1) * eps
    )
    v = _rand(12, B, *SHAPE).requires_grad_()
    F = v.detach().clone().requires_grad_()
    old = _rand(13, B)
    logp, adv = old.clone().requires_grad_(), torch.zeros(B, dtype=torch.float64)
    data_beta = 0.01
    loss, metrics = ddrl_loss(
        logp, old, adv, 1e-4, data_beta=data_beta, v_data=v, x0=x0, eps=eps, data_weight=data_weight(s, "edm")
    )
    loss.backward()
    want = data_beta * _cosmos_rl_data_loss(F, x0, eps, s)
    want.backward()
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
    torch.testing.assert_close(v.grad, F.grad, rtol=1e-10, atol=1e-16)
    assert float(metrics["data_loss"]) == pytest.approx(float(want.detach()) / data_beta, rel=1e-12)
    # the weights the review quotes against sanarl's former w = 1, and "uniform" restores that
    assert data_weight(torch.tensor([0.1, 0.3, 0.5]), "edm").tolist() == pytest.approx([0.82, 0.58, 0.50])
    plain = ddrl_loss(logp.detach(), old, adv, 1e-4, data_beta=1.0, v_data=v.detach(), x0=x0, eps=eps,
                      data_weight=data_weight(s, "uniform"))[0]  # fmt: skip
    assert float(plain) == pytest.approx(float((v.detach() - (eps - x0)).square().mean()), rel=1e-12)
    with pytest.raises(ValueError, match="edm, uniform"):
        data_weight(s, "sigma_sqrt")


def test_loss_scale_ten_multiplies_the_loss_and_changes_the_clipped_gradient():
    """Cosmos-RL returns `loss * loss_scale` and clips the gradient norm to 1.0 afterwards: the clipped gradient is
    the scaled one cut to norm 1, which differs from the unscaled loss's gradient when its norm lies in (0.1, 1)."""
    clip, data_beta = 0.05, 0.7
    old = _rand(20, B)
    logp = (old + torch.tensor([0.2, -0.2, 0.01, -0.02], dtype=torch.float64)).requires_grad_()
    adv_raw = torch.tensor([0.8, -0.5, -2.0, 1.5], dtype=torch.float64)
    v, x0, eps = (0.05 * _rand(21, B, *SHAPE)).requires_grad_(), _rand(22, B, *SHAPE), _rand(23, B, *SHAPE)
    v.data += eps - x0  # near the target: a gradient norm below 1 unscaled
    mean = torch.zeros(B, *SHAPE, dtype=torch.float64)
    adv = adv_raw.clone()  # within the clip range and no exp reward: the identity
    loss, _ = ddrl_loss(logp, old, adv, clip, data_beta=data_beta, v_data=v, x0=x0, eps=eps, loss_scale=10.0)
    loss.backward()
    want, g_logp, _, g_v = _reference(
        logp.detach(), old, adv_raw, clip, 0.0, mean, mean, torch.ones(B, dtype=torch.float64), data_beta,
        v.detach(), x0, eps, -5.0, 5.0, exp_reward=False,
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(10.0 * want, rel=1e-12)
    torch.testing.assert_close(logp.grad, 10.0 * g_logp, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(v.grad, 10.0 * g_v, rtol=1e-10, atol=1e-14)
    # under clip_grad_norm_(1.0): the reference's update is the scaled gradient cut to norm 1
    norm = math.sqrt(float(g_logp.square().sum() + g_v.square().sum()))
    assert 0.1 < norm < 1.0  # unscaled: not clipped; scaled by 10: clipped
    torch.nn.utils.clip_grad_norm_([logp, v], 1.0)
    cut = 1.0 / (10.0 * norm)
    torch.testing.assert_close(logp.grad, 10.0 * cut * g_logp, rtol=1e-6, atol=1e-14)
    torch.testing.assert_close(v.grad, 10.0 * cut * g_v, rtol=1e-6, atol=1e-14)
    assert not torch.allclose(v.grad, g_v)  # the unscaled loss would step by g itself


def test_the_unbiased_per_group_normaliser_is_cosmos_rls():
    """Cosmos-RL's `_sync_rewards_across_rollouts`: (r - mean) / (torch.std(r) + 1e-4) over each data item's
    rollouts, torch.std dividing by N - 1."""
    rewards = torch.randn(32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    prompts = [f"p{i // 8}" for i in range(32)]
    got = PerPromptStatTracker(global_std=False, unbiased=True).compute(prompts, rewards)
    for g in range(4):
        r = rewards[8 * g : 8 * g + 8].tolist()
        mean = sum(r) / 8
        sd = math.sqrt(sum((x - mean) ** 2 for x in r) / 7)
        want = [(x - mean) / (sd + 1e-4) for x in r]
        assert got[8 * g : 8 * g + 8].tolist() == pytest.approx(want, rel=1e-12)
    # the published Flow-GRPO / DiffusionNFT normaliser (the default) is unchanged: population std of the call
    flat = rewards.tolist()
    mean_all = sum(flat) / 32
    sd_all = math.sqrt(sum((x - mean_all) ** 2 for x in flat) / 32)
    default = PerPromptStatTracker().compute(prompts, rewards)
    g0 = flat[:8]
    assert default[:8].tolist() == pytest.approx([(x - sum(g0) / 8) / (sd_all + 1e-4) for x in g0], rel=1e-12)
    assert float((got - default).abs().max()) > 0.05
