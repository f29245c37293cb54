"""Diffusion-DPO's math (sanarl.core.dpo_loss) against its references, re-derived here with plain torch ops:
SalesforceAIResearch/DiffusionDPO train.py (the DPO branch of the loss, in its order: model_diff - ref_diff) and
X-GenGroup/Flow-Factory trainers/dpo.py (the velocity-target errors, w_diff - l_diff, the implicit accuracy and the
best/worst pairing with numpy's argmax/argmin)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sanarl.core.dpo_loss import best_worst_pairs, dpo_loss, velocity_errors


def _pairs(seed: int, p: int = 4, shape=(4, 3, 3)):
    g = torch.Generator().manual_seed(seed)
    x_w, x_l = torch.randn(p, *shape, generator=g), torch.randn(p, *shape, generator=g)
    eps = torch.randn(p, *shape, generator=g)  # one noise for both members of a pair
    v_w = torch.randn(p, *shape, generator=g).requires_grad_(True)
    v_l = torch.randn(p, *shape, generator=g).requires_grad_(True)
    r_w, r_l = torch.randn(p, *shape, generator=g), torch.randn(p, *shape, generator=g)
    return x_w, x_l, eps, v_w, v_l, r_w, r_l


def _ff_loss(v_w, v_l, r_w, r_l, x_w, x_l, eps, beta):
    """Flow-Factory's DPOTrainer.optimize loss block."""
    target_w, target_l = eps - x_w, eps - x_l
    dims = tuple(range(1, v_w.ndim))
    theta_w_err = ((v_w.float() - target_w.float()) ** 2).mean(dim=dims)
    theta_l_err = ((v_l.float() - target_l.float()) ** 2).mean(dim=dims)
    ref_w_err = ((r_w.float() - target_w.float()) ** 2).mean(dim=dims)
    ref_l_err = ((r_l.float() - target_l.float()) ** 2).mean(dim=dims)
    w_diff = theta_w_err - ref_w_err
    l_diff = theta_l_err - ref_l_err
    inside_term = -0.5 * beta * (w_diff - l_diff)
    acc = ((-0.5 * beta * w_diff) > (-0.5 * beta * l_diff)).float().mean()
    return -F.logsigmoid(inside_term).mean(), acc


def _salesforce_loss(v_w, v_l, r_w, r_l, x_w, x_l, eps, beta):
    """DiffusionDPO train.py's DPO branch on the stacked [w; l] batch, with the velocity target in place of eps."""
    model_pred, ref_pred = torch.cat([v_w, v_l]), torch.cat([r_w, r_l])
    target = torch.cat([eps - x_w, eps - x_l])
    model_losses = (model_pred - target).pow(2).mean(dim=[1, 2, 3])
    model_losses_w, model_losses_l = model_losses.chunk(2)
    model_diff = model_losses_w - model_losses_l
    ref_losses = (ref_pred - target).pow(2).mean(dim=[1, 2, 3])
    ref_losses_w, ref_losses_l = ref_losses.chunk(2)
    ref_diff = ref_losses_w - ref_losses_l
    inside_term = -0.5 * beta * (model_diff - ref_diff)
    implicit_acc = (inside_term > 0).sum().float() / inside_term.size(0)
    return -1 * F.logsigmoid(inside_term).mean(), implicit_acc


def _ours(v_w, v_l, r_w, r_l, x_w, x_l, eps, beta):
    return dpo_loss(
        velocity_errors(v_w, x_w, eps),
        velocity_errors(v_l, x_l, eps),
        velocity_errors(r_w, x_w, eps),
        velocity_errors(r_l, x_l, eps),
        beta,
    )


@pytest.mark.parametrize("beta", [0.5, 5.0, 100.0, 5000.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_matches_both_references_values_and_gradients(beta, seed):
    x_w, x_l, eps, v_w, v_l, r_w, r_l = _pairs(seed)
    # pull the policy towards the reference so the loss sits away from saturation at large beta
    with torch.no_grad():
        v_w.mul_(0.02).add_(0.98 * r_w)
        v_l.mul_(0.02).add_(0.98 * r_l)
    loss, metrics = _ours(v_w, v_l, r_w, r_l, x_w, x_l, eps, beta)
    g_got = torch.autograd.grad(loss, (v_w, v_l))
    for ref_fn in (_ff_loss, _salesforce_loss):
        a, b = v_w.detach().clone().requires_grad_(True), v_l.detach().clone().requires_grad_(True)
        want, acc = ref_fn(a, b, r_w, r_l, x_w, x_l, eps, beta)
        g_want = torch.autograd.grad(want, (a, b))
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        for x, y in zip(g_got, g_want, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)
        assert float(metrics["implicit_acc"]) == float(acc)


def test_model_equal_to_reference_gives_log_two_and_zero_accuracy():
    x_w, x_l, eps, _, _, r_w, r_l = _pairs(4)
    v_w, v_l = r_w.clone().requires_grad_(True), r_l.clone().requires_grad_(True)
    loss, metrics = _ours(v_w, v_l, r_w, r_l, x_w, x_l, eps, 5000.0)
    assert float(loss.detach()) == pytest.approx(math.log(2), abs=1e-7)
    assert float(metrics["implicit_acc"]) == 0.0 and float(metrics["reward_margin"]) == 0.0
    # the gradient at that point is beta / 4 (d err_w - d err_l), per pair, over P pairs
    g_w, g_l = torch.autograd.grad(loss, (v_w, v_l))
    n = r_w[0].numel()
    want_w = 5000.0 / 4 * 2 * (r_w - (eps - x_w)) / n / 4
    torch.testing.assert_close(g_w, want_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_l, -5000.0 / 4 * 2 * (r_l - (eps - x_l)) / n / 4, rtol=1e-5, atol=1e-6)


def test_a_policy_that_fits_the_chosen_better_than_the_reference_wins():
    x_w, x_l, eps, _, _, r_w, r_l = _pairs(5)
    v_w = (0.5 * r_w + 0.5 * (eps - x_w)).requires_grad_(True)  # halfway to the chosen target
    loss, metrics = _ours(v_w, r_l.clone(), r_w, r_l, x_w, x_l, eps, 1.0)
    assert float(loss.detach()) < math.log(2)
    assert float(metrics["implicit_acc"]) == 1.0


def test_velocity_errors_by_hand():
    x0 = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    eps = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    v = torch.tensor([[-1.0, 0.0], [1.0, 1.0]])
    # targets [-1, -2] and [1, -1]: errors (0 + 4) / 2 and (0 + 4) / 2
    assert velocity_errors(v, x0, eps).tolist() == [2.0, 2.0]


def _ff_pairs(groups, adv):
    """Flow-Factory's _form_pairs_from_advantages on integer group ids (np.unique order)."""
    ids = np.array(groups, dtype=np.int64)
    _, group_indices = np.unique(ids, return_inverse=True)
    advantages = np.array(adv, dtype=np.float64)
    pairs = []
    for gid in np.unique(group_indices):
        mask = np.where(group_indices == gid)[0]
        if len(mask) < 2:
            continue
        group_adv = advantages[mask]
        pairs.append((int(mask[np.argmax(group_adv)]), int(mask[np.argmin(group_adv)])))
    return pairs


@pytest.mark.parametrize("seed", range(6))
def test_best_worst_pairs_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    groups = sorted(rng.integers(0, 5, size=16).tolist())  # ascending ids: np.unique order = appearance order
    adv = rng.integers(-2, 3, size=16).astype(float).tolist()  # many ties
    got = best_worst_pairs(groups, torch.tensor(adv))
    assert got == _ff_pairs(groups, adv)


def test_pairs_skip_singletons_and_all_equal_groups_pair_with_themselves():
    assert best_worst_pairs(["a", "b", "b", "c", "c"], torch.tensor([1.0, 0.0, 2.0, 3.0, 3.0])) == [
        (2, 1),
        (3, 3),
    ]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), 0.0), "beta_dpo"),
        (lambda: dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2), 1.0), "one shape"),
        (lambda: best_worst_pairs(["a", "a"], torch.tensor([1.0, float("nan")])), "NaN"),
        (lambda: best_worst_pairs(["a"], torch.tensor([1.0, 2.0])), "one group key per score"),
    ],
)
def test_bad_arguments_name_what_is_wrong(call, words):
    with pytest.raises(ValueError, match=words):
        call()
