"""Parity with the reference formulas (docs/algorithms.md): each reference quantity is re-derived here, element by
element in float64 from its formula, never by calling the sanarl function under test; values AND gradients.

Covered: the flow_sde and CPS log-probs (value and d/dv), the PPO ratio and clip (value and d/dlogp, clipped and
unclipped rows), the mean-matching KL, the NFT loss (value and d/dv_theta) and its old-policy decay counter, the
SOAR auxiliary points (boundary included), targets and normaliser.
"""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.grpo_loss import gaussian_mean_kl, ppo_clip_loss
from sanarl.core.nft_loss import nft_loss
from sanarl.core.samplers import cps_step, flow_sde_step
from sanarl.core.soar_math import soar_normaliser
from sanarl.training.ema import old_weight_decay

B, SHAPE = 3, (3, 2, 2, 2)


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- Flow-GRPO's stochastic steps --------------------------------------------------------------------------------
def _flow_sde_reference(x, v, x_next, s, s_next, s1, eta):
    """flow_grpo's SDE step: std = eta sqrt(s / (1 - s)) (s_1 at s = 1), its mean and the Gaussian log-density."""
    out = []
    for b in range(x.shape[0]):
        dt = s_next[b] - s[b]
        std = eta * math.sqrt(s[b] / (1 - (s1 if s[b] >= 1 else s[b])))
        mean = x[b] * (1 + std**2 / (2 * s[b]) * dt) + v[b] * (1 + std**2 * (1 - s[b]) / (2 * s[b])) * dt
        sigma = std * math.sqrt(-dt)
        elem = (
            -((x_next[b] - mean) ** 2) / (2 * sigma**2) - math.log(sigma) - math.log(math.sqrt(2 * math.pi))
        )
        out.append(elem.mean())
    return torch.stack(out)


def _cps_reference(x, v, x_next, s, s_next, eta):
    """flow_grpo's CPS step: std = s' sin(eta pi / 2), mean from x0_hat and x1_hat, log-prob -mean (x' - mu)^2."""
    out = []
    for b in range(x.shape[0]):
        std = s_next[b] * math.sin(eta * math.pi / 2)
        x0_hat, x1_hat = x[b] - s[b] * v[b], x[b] + (1 - s[b]) * v[b]
        mean = (1 - s_next[b]) * x0_hat + math.sqrt(s_next[b] ** 2 - std**2) * x1_hat
        out.append(-((x_next[b] - mean) ** 2).mean())
    return torch.stack(out)


@pytest.mark.parametrize("solver", ["flow_sde", "cps"])
def test_step_log_probs_and_their_velocity_gradients_match_the_reference(solver):
    x, v, x_next = _rand(0, *SHAPE), _rand(1, *SHAPE), _rand(2, *SHAPE)
    s, s_next = [1.0, 0.7, 0.3], [0.9, 0.5, 0.1]  # includes the s = 1 guard of flow_sde
    eta = 0.7 if solver == "flow_sde" else 0.8
    v_ours = v.clone().float().requires_grad_(True)
    st, snt = torch.tensor(s), torch.tensor(s_next)
    if solver == "flow_sde":
        _, logp, _, _ = flow_sde_step(
            x.float(), v_ours, st, snt, eta=eta, s_first_next=0.9, x_next=x_next.float()
        )
    else:
        _, logp, _, _ = cps_step(x.float(), v_ours, st, snt, eta=eta, x_next=x_next.float())
    v_ref = v.clone().requires_grad_(True)
    if solver == "flow_sde":
        ref = _flow_sde_reference(x, v_ref, x_next, s, s_next, 0.9, eta)
    else:
        ref = _cps_reference(x, v_ref, x_next, s, s_next, eta)
    torch.testing.assert_close(logp.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    weights = torch.tensor([0.3, -1.2, 0.8], dtype=torch.float64)
    (logp.double() * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(v_ours.grad.double(), v_ref.grad, rtol=1e-4, atol=1e-6)


def test_cps_log_prob_has_no_gaussian_factor():
    """Without 1/(2 std^2) the score at a step with std = 0.3 is 2 std^2 = 0.18 times the Gaussian quadratic term."""
    x, v, x_next = _rand(3, 1, 4), _rand(4, 1, 4), _rand(5, 1, 4)
    eta = 2 * math.asin(0.3 / 0.5) / math.pi  # std = s' sin(eta pi / 2) = 0.3 at s' = 0.5
    _, logp, mean, std = cps_step(x.float(), v.float(), 0.8, 0.5, eta=eta, x_next=x_next.float())
    assert float(std) == pytest.approx(0.3, abs=1e-6)
    quad = ((x_next.float() - mean) ** 2).mean()
    assert float(logp) == pytest.approx(-float(quad), rel=1e-6)


# --- PPO ratio, clip and KL ------------------------------------------------------------------------------------
def test_ppo_ratio_and_clip_value_and_gradient_match_the_reference():
    eps = 1e-2
    old = torch.tensor([0.0, 0.1, -0.2, 0.3, 0.05, -0.1], dtype=torch.float64)
    delta = torch.tensor(
        [0.005, 0.03, -0.03, -0.004, 0.02, -0.02], dtype=torch.float64
    )  # in and out of the clip
    adv = torch.tensor([1.0, 2.0, -1.5, 0.5, -1.0, 1.0], dtype=torch.float64)
    logp = (old + delta).requires_grad_(True)
    loss, metrics = ppo_clip_loss(logp, old, adv, eps)
    loss.backward()
    # reference, row by row: max(-A r, -A clamp(r)); the gradient is -A r where the unclipped term is the max
    values, grads = [], []
    for j in range(6):
        r = math.exp(float(delta[j]))
        unclipped, clipped = -float(adv[j]) * r, -float(adv[j]) * min(max(r, 1 - eps), 1 + eps)
        values.append(max(unclipped, clipped))
        grads.append((-float(adv[j]) * r if unclipped >= clipped else 0.0) / 6)
    assert loss.item() == pytest.approx(sum(values) / 6, rel=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor(grads, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    ratios = [math.exp(float(d)) for d in delta]
    assert float(metrics["clip_frac"]) == pytest.approx(sum(abs(r - 1) > eps for r in ratios) / 6)
    assert float(metrics["ratio_mean"]) == pytest.approx(sum(ratios) / 6, rel=1e-12)


def test_mean_matching_kl_value_and_gradient_match_the_published_form():
    mu, mu_ref = _rand(6, *SHAPE).requires_grad_(True), _rand(7, *SHAPE)
    std = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    kl = gaussian_mean_kl(mu, mu_ref, std)
    kl.sum().backward()
    for b in range(B):
        n = mu[b].numel()
        diff = mu[b].detach() - mu_ref[b]
        assert kl[b].item() == pytest.approx(float((diff**2).sum() / n / (2 * std[b] ** 2)), rel=1e-12)
        torch.testing.assert_close(mu.grad[b], diff / (n * std[b] ** 2))


# --- DiffusionNFT ------------------------------------------------------------------------------------------------
def _nft_reference(v_th, v_old, x_t, x0, t, adv, beta, c):
    """The DiffusionNFT objective per sample, from its formula (the normaliser a constant)."""
    total = 0.0
    for b in range(v_th.shape[0]):
        a = min(max(float(adv[b]), -c), c)
        r = min(max(a / (2 * c) + 0.5, 0.0), 1.0)
        terms = []
        for v in (beta * v_th[b] + (1 - beta) * v_old[b], (1 + beta) * v_old[b] - beta * v_th[b]):
            err = x_t[b] - t[b] * v - x0[b]
            terms.append((err**2).mean() / max(float(err.detach().abs().mean()), 1e-5))
        total = total + r * terms[0] + (1 - r) * terms[1]
    return total / v_th.shape[0] * c / beta


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_loss_value_and_gradient_match_the_reference(beta):
    v_th, v_old, x0, eps = (_rand(i, *SHAPE) for i in (8, 9, 10, 11))
    t = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    x_t = (1 - t.view(B, 1, 1, 1)) * x0 + t.view(B, 1, 1, 1) * eps
    adv = torch.tensor([7.0, -1.5, 0.3], dtype=torch.float64)  # the first is clipped at C = 5
    ours = v_th.clone().requires_grad_(True)
    loss, _ = nft_loss(ours, v_old, x_t, x0, t, adv, beta=beta, adv_clip_max=5.0)
    loss.backward()
    theirs = v_th.clone().requires_grad_(True)
    ref = _nft_reference(theirs, v_old, x_t, x0, t, adv, beta, 5.0)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-9, atol=1e-12)


def test_nft_decay_counter_is_in_optimizer_steps():
    """DiffusionNFT's decay reads its global (optimizer) step: type 1 = min(0.001 k, 0.5), type 2 = 0 until 75,
    then min(0.0075 (k - 75), 0.999), type 0 = 0; the NFT task passes k = optimizer steps done (issue 16)."""
    for k in (1, 2, 10, 499, 500, 501, 2000):
        assert old_weight_decay(k, 1) == pytest.approx(min(0.001 * k, 0.5))
        assert old_weight_decay(k, 0) == 0.0
    for k in (1, 74, 75, 76, 100, 300):
        assert old_weight_decay(k, 2) == pytest.approx(0.0 if k < 75 else min(0.0075 * (k - 75), 0.999))


# --- SOAR --------------------------------------------------------------------------------------------------------
def test_soar_aux_points_boundary_targets_and_normaliser_match_the_reference():
    """HY-SOAR's construction for 2 paths x 2 points, one sample at the t1 = 0 boundary, re-derived element-wise."""
    from sanarl.core.flow import shift_sigmas
    from sanarl.methods.soar.task import aux_points, soar_levels

    u = torch.tensor([0.6, 0.1, 0.9])  # with 4 sampling steps the second sample sits at t1 = 0
    s0, s1, active = soar_levels(u, 4, 3.0)
    assert active.tolist() == [True, False, True]
    z0, z1, v = (_rand(i, *SHAPE).float() for i in (12, 13, 14))
    z_s0 = (1 - s0.view(B, 1, 1, 1)) * z0 + s0.view(B, 1, 1, 1) * z1
    s_prime = torch.tensor(
        [[[0.8, 0.9], [0.7, 0.95]], [[0.05, 0.2], [0.1, 0.3]], [[0.99, 1.0], [0.97, 0.98]]]
    )
    noise = _rand(15, B, 1, *SHAPE[1:]).float()
    draws = {"s0": s0, "s1": s1, "active": active, "s_prime": s_prime, "path_noise": noise}
    aux = aux_points(z0, z1, z_s0, v, draws, "simple", 0.5)
    expected = []  # (path, point, row), path 0 from every sample, path 1 from the active ones
    for m in range(2):
        rows = [0, 1, 2] if m == 0 else [0, 2]
        for p in range(2):
            for b in rows:
                dt = float(s1[b] - s0[b])
                z1p = z_s0[b] + v[b] * dt
                if m == 1:
                    z1p = z1p + 0.5 * math.sqrt(abs(dt)) * noise[b, 0]
                sp, lo = float(s_prime[b, m, p]), float(s1[b])
                a = (sp - lo) / (1 - lo)
                zp = (1 - a) * z1p + a * z1[b]
                expected.append((b, sp, zp, (zp - z0[b]) / sp))
    assert aux.owner.tolist() == [e[0] for e in expected]
    torch.testing.assert_close(aux.s, torch.tensor([e[1] for e in expected]))
    torch.testing.assert_close(aux.z, torch.stack([e[2] for e in expected]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(aux.target, torch.stack([e[3] for e in expected]), rtol=1e-4, atol=1e-4)
    assert float(s0[1]) == pytest.approx(float(shift_sigmas(torch.tensor([0.1]), 3.0)[0]))
    # normaliser: max(N_main + lambda N_aux, 1) over the global counts
    assert float(soar_normaliser(torch.tensor(3.0), torch.tensor(10.0), 0.5)) == pytest.approx(8.0)
    assert soar_normaliser(0.0, 0.0, 1.0) == 1.0
