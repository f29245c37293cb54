"""Numerical checks of the RL math (docs/algorithms.md, "DiffusionNFT" to "Flow-GRPO" and
"Numerical checks")."""

from __future__ import annotations

import math

import pytest
import torch

from sanarl.core.advantages import PerPromptStatTracker, clip_advantages, nan_mask, nft_adv_transform
from sanarl.core.grpo_loss import drop_zero_std_groups, gaussian_mean_kl, ppo_clip_loss
from sanarl.core.nft_loss import nft_loss
from sanarl.core.selection import SELECTION_MODES, select_indices
from sanarl.rewards.combine import RewardSpec, combine_rewards

# ---------------------------------------------------------------- stat tracker


def test_tracker_global_std_by_hand() -> None:
    tracker = PerPromptStatTracker(global_std=True)
    adv = tracker.compute(["a", "a", "b", "b"], torch.tensor([1.0, 3.0, 2.0, 2.0], dtype=torch.float64))
    # all rewards: mean 2, population variance (1 + 1 + 0 + 0) / 4 = 0.5
    sd = math.sqrt(0.5)
    expected = [-1 / (sd + 1e-4), 1 / (sd + 1e-4), 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-12)
    assert tracker.stats() == {"zero_std_ratio": 0.5, "mean_group_std": 0.5, "num_groups": 2.0}


def test_tracker_group_std_by_hand() -> None:
    tracker = PerPromptStatTracker(global_std=False)
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0, 4.0, 5.0], dtype=torch.float64)
    adv = tracker.compute(["a", "a", "b", "b", "c", "c", "c"], rewards)
    # group a: mean 2, std 1; group b: all equal; group c: mean 3, var (9 + 1 + 4) / 3
    sd_c = math.sqrt(14 / 3)
    expected = [-1 / 1.0001, 1 / 1.0001, 0.0, 0.0, -3 / (sd_c + 1e-4), 1 / (sd_c + 1e-4), 2 / (sd_c + 1e-4)]
    assert adv.tolist() == pytest.approx(expected, rel=1e-12)
    assert tracker.stats()["zero_std_ratio"] == pytest.approx(1 / 3)
    assert tracker.stats()["mean_group_std"] == pytest.approx((1 + 0 + sd_c) / 3)


@pytest.mark.parametrize("global_std", [True, False])
def test_tracker_equal_rewards_give_zero(global_std: bool) -> None:
    prompts = ["x"] * 4 + ["y"] * 4
    rewards = torch.tensor([0.7] * 4 + [0.1, 0.9, 0.3, 0.3])
    adv = PerPromptStatTracker(global_std).compute(prompts, rewards)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert adv[4:].abs().sum() > 0.5


@pytest.mark.parametrize("global_std", [True, False])
def test_tracker_invariant_to_shuffling(global_std: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    prompts = [f"prompt {i % 5}" for i in range(40)]
    rewards = torch.randn(40, generator=gen, dtype=torch.float64)
    tracker = PerPromptStatTracker(global_std)
    adv = tracker.compute(prompts, rewards)
    perm = torch.randperm(40, generator=gen)
    adv_perm = tracker.compute([prompts[i] for i in perm], rewards[perm])
    torch.testing.assert_close(adv_perm, adv[perm], rtol=1e-12, atol=1e-12)
    # zero-mean within each group
    for p in set(prompts):
        idx = [i for i, q in enumerate(prompts) if q == p]
        assert float(adv[idx].sum()) == pytest.approx(0.0, abs=1e-10)


def test_tracker_rejects_bad_input() -> None:
    tracker = PerPromptStatTracker()
    with pytest.raises(ValueError, match="3 prompts but 2 rewards"):
        tracker.compute(["a", "b", "c"], torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="non-finite"):
        tracker.compute(["a", "b"], torch.tensor([1.0, float("nan")]))


# ---------------------------------------------------------------- advantage transforms


def test_clip_and_nft_adv_modes() -> None:
    a = torch.tensor([-7.0, -2.0, 0.0, 3.0, 6.0])
    assert clip_advantages(a, -1.0, 4.0).tolist() == [-1.0, -1.0, 0.0, 3.0, 4.0]
    assert nft_adv_transform(a, "all", 5.0).tolist() == [-5.0, -2.0, 0.0, 3.0, 5.0]
    assert nft_adv_transform(a, "positive_only", 5.0).tolist() == [0.0, 0.0, 0.0, 3.0, 5.0]
    assert nft_adv_transform(a, "negative_only", 5.0).tolist() == [-5.0, -2.0, 0.0, 0.0, 0.0]
    assert nft_adv_transform(a, "one_only", 5.0).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert nft_adv_transform(a, "binary", 5.0).tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="unknown adv_mode 'pos'"):
        nft_adv_transform(a, "pos", 5.0)


# ---------------------------------------------------------------- reward combiner


def test_combine_rewards_by_hand() -> None:
    scores = {
        "pick": torch.tensor([0.5, 2.0, -1.0]),
        "ocr_acc": torch.tensor([1.0, 0.0, 0.5]),
        "unused": torch.tensor([9.0, 9.0, 9.0]),
    }
    fns = [
        RewardSpec("pick", weight=2.0, clip_min=-0.5, clip_max=1.0),  # empty score_key -> the name
        RewardSpec("ocr", weight=0.5, score_key="ocr_acc"),
    ]
    total, per_key = combine_rewards(scores, fns, scale=2.0, clip_min=-0.5, clip_max=1.8)
    # pick: clamp -> [0.5, 1.0, -0.5] * 2 = [1, 2, -1]; ocr: * 0.5 = [0.5, 0, 0.25]; sum = [1.5, 2, -0.75]
    assert per_key["avg"].tolist() == pytest.approx([1.5, 2.0, -0.75])
    # clamp to [-0.5, 1.8] then * 2
    assert total.tolist() == pytest.approx([3.0, 3.6, -1.0])
    assert per_key["pick"].tolist() == [0.5, 2.0, -1.0]
    assert per_key["ocr"].tolist() == [1.0, 0.0, 0.5]
    assert set(per_key) == {"pick", "ocr", "avg"}


def test_combine_rewards_without_clips() -> None:
    total, _ = combine_rewards({"a": torch.tensor([1.0, -3.0])}, [RewardSpec("a", weight=-1.5)])
    assert total.tolist() == [-1.5, 4.5]


def test_combine_rewards_missing_key_message() -> None:
    scores = {"pickscore": torch.zeros(2), "clip": torch.zeros(2)}
    with pytest.raises(KeyError) as err:
        combine_rewards(scores, [RewardSpec("ocr", score_key="ocr_strict")])
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    assert "'ocr'" in msg and "'ocr_strict'" in msg and "['clip', 'pickscore']" in msg and "score_key" in msg


def test_combine_rewards_nan_mask() -> None:
    scores = {"a": torch.tensor([1.0, float("nan"), 2.0])}
    total, _ = combine_rewards(scores, [RewardSpec("a")], clip_min=0.0, clip_max=1.5)
    assert nan_mask(total).tolist() == [False, True, False]
    assert total[~nan_mask(total)].tolist() == [1.0, 1.5]


# ---------------------------------------------------------------- selection


def test_best_worst_picks_the_right_indices() -> None:
    r = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.7, 0.2])
    assert select_indices(r, 4, "best_worst").tolist() == [1, 2, 4, 5]
    assert select_indices(r, 3, "best_worst").tolist() == [1, 2, 5]  # top 1, bottom 2
    assert select_indices(r, 1, "best_worst").tolist() == [2]  # k // 2 == 0: only the worst
    assert select_indices(r, 6, "best_worst").tolist() == [0, 1, 2, 3, 4, 5]


def test_best_worst_ties_are_deterministic_and_distinct() -> None:
    ties = torch.ones(4)
    assert select_indices(ties, 2, "best_worst").tolist() == [0, 1]
    assert select_indices(ties, 3, "best_worst").tolist() == [0, 1, 2]
    assert select_indices(ties, 4, "best_worst").tolist() == [0, 1, 2, 3]
    # best tie -> lowest index; the bottom comes from what is left
    r = torch.tensor([2.0, 5.0, 5.0, 2.0, 3.0])
    assert select_indices(r, 2, "best_worst").tolist() == [0, 1]
    assert select_indices(r, 4, "best_worst").tolist() == [0, 1, 2, 3]


def test_mean_deviation_by_hand() -> None:
    r = torch.tensor([0.0, 10.0, 4.0, 6.0, 5.0])  # mean 5, |dev| = [5, 5, 1, 1, 0]
    assert select_indices(r, 2, "mean_deviation").tolist() == [0, 1]
    assert select_indices(r, 3, "mean_deviation").tolist() == [0, 1, 2]


def test_extremes_random_keeps_extremes() -> None:
    r = torch.tensor([0.5, 0.2, 0.9, 0.4, 0.0, 0.6, 0.3, 0.7, 0.8, 0.1])
    seen = set()
    for seed in range(10):
        idx = select_indices(r, 4, "extremes_random", generator=torch.Generator().manual_seed(seed))
        assert {2, 4} <= set(idx.tolist())  # best (0.9) and worst (0.0)
        seen |= set(idx.tolist()) - {2, 4}
    assert len(seen) > 2  # the middle is really random
    a = select_indices(r, 5, "extremes_random", generator=torch.Generator().manual_seed(3))
    b = select_indices(r, 5, "extremes_random", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("mode", SELECTION_MODES)
def test_selection_exactly_k_distinct(mode: str) -> None:
    gen = torch.Generator().manual_seed(1)
    for m in (1, 2, 5, 24, 96):
        r = torch.randint(0, 3, (m,), generator=gen).float()  # many ties
        for k in sorted({1, m // 2 or 1, m - 1 or 1, m}):
            idx = select_indices(r, k, mode, generator=gen)
            assert idx.dtype == torch.long and idx.shape == (k,)
            assert len(set(idx.tolist())) == k and 0 <= int(idx.min()) and int(idx.max()) < m


def test_selection_errors() -> None:
    r = torch.arange(4.0)
    with pytest.raises(ValueError, match="k=5 of 4"):
        select_indices(r, 5, "best_worst")
    with pytest.raises(ValueError, match="k=0"):
        select_indices(r, 0, "random")
    with pytest.raises(ValueError, match="unknown selection mode"):
        select_indices(r, 2, "top")


# ---------------------------------------------------------------- NFT loss


def _nft_case() -> dict[str, torch.Tensor]:
    """Two samples of one element each; values chosen so every quantity is a small integer."""
    return {
        "v_theta": torch.tensor([1.0, 2.0]).reshape(2, 1, 1, 1),
        "v_old": torch.tensor([0.0, 1.0]).reshape(2, 1, 1, 1),
        "x_t": torch.tensor([0.5, 2.0]).reshape(2, 1, 1, 1),
        "x0": torch.tensor([1.0, 0.0]).reshape(2, 1, 1, 1),
        "t": torch.tensor([0.5, 0.5]),
    }


def test_nft_loss_hand_small() -> None:
    # sample 0: A = 5 -> r = 1; x0_pos = 0.5 - 0.5 * 1 = 0, err -1, L_pos = 1 / 1 = 1
    # sample 1: A = -5 -> r = 0; v_neg = 2 * 1 - 2 = 0, x0_neg = 2, err 2, L_neg = 4 / 2 = 2
    # policy = mean(1, 2) * C / beta = 1.5 * 5 = 7.5
    loss, m = nft_loss(**_nft_case(), adv=torch.tensor([5.0, -5.0]), beta=1.0, adv_clip_max=5.0)
    assert float(loss) == pytest.approx(7.5)
    assert float(m["policy_loss"]) == pytest.approx(7.5)
    assert float(m["r_mean"]) == pytest.approx(0.5)
    assert float(m["old_deviation"]) == pytest.approx(1.0)  # mean (1 - 0)^2, (2 - 1)^2
    assert float(m["kl_div_loss"]) == 0.0


def test_nft_loss_pairs_r_per_sample() -> None:
    # L_pos = [1, 1] (sample 1: x0_pos = 2 - 0.5 * 2 = 1), L_neg = [0, 2]. Broadcasting a [B, 1] r against the
    # [B] losses would give mean([[1, 1], [0, 2]]) * 5 = 5.0 instead of 7.5.
    loss, _ = nft_loss(**_nft_case(), adv=torch.tensor([[5.0], [-5.0]]), beta=1.0, adv_clip_max=5.0)
    assert float(loss) == pytest.approx(7.5)
    with pytest.raises(ValueError, match="one advantage per sample"):
        nft_loss(**_nft_case(), adv=torch.ones(2, 2), beta=1.0, adv_clip_max=5.0)


def _plain_nft(case: dict[str, list], adv: list[float], beta: float, c: float, kl_beta: float) -> float:
    """The NFT loss with Python floats only, sample by sample, element by element."""
    per_sample = []
    kls = []
    for b in range(len(adv)):
        a_c = min(max(adv[b], -c), c)
        r = min(max(a_c / (2 * c) + 0.5, 0.0), 1.0)
        t = case["t"][b]
        pos_err, neg_err, kl = [], [], []
        for vt, vo, xt, x0, vr in zip(
            case["v_theta"][b], case["v_old"][b], case["x_t"][b], case["x0"][b], case["v_ref"][b], strict=True
        ):
            pos_err.append(xt - t * (beta * vt + (1 - beta) * vo) - x0)
            neg_err.append(xt - t * ((1 + beta) * vo - beta * vt) - x0)
            kl.append((vt - vr) ** 2)
        n = len(pos_err)
        l_pos = sum(e * e for e in pos_err) / n / max(sum(abs(e) for e in pos_err) / n, 1e-5)
        l_neg = sum(e * e for e in neg_err) / n / max(sum(abs(e) for e in neg_err) / n, 1e-5)
        per_sample.append(r * l_pos + (1 - r) * l_neg)
        kls.append(sum(kl) / n)
    policy = sum(per_sample) / len(adv) * c / beta
    return policy + kl_beta * sum(kls) / len(adv)


def test_nft_loss_against_plain_arithmetic() -> None:
    case = {
        "v_theta": [[0.2, -0.4, 1.0, 0.0], [1.0, 2.0, -0.5, 0.3]],
        "v_old": [[0.0, 0.2, 0.8, 0.1], [0.6, 1.0, -0.2, 0.0]],
        "x_t": [[0.5, 1.0, 0.0, -1.0], [1.0, 0.0, 0.4, 0.2]],
        "x0": [[1.0, 2.0, -0.3, -1.2], [0.0, -1.0, 0.5, 0.0]],
        "v_ref": [[0.1, 0.1, 0.1, 0.1], [0.9, 1.5, 0.0, -0.1]],
        "t": [0.5, 0.25],
    }
    tens = {k: torch.tensor(v, dtype=torch.float64) for k, v in case.items()}
    kwargs = {k: tens[k].reshape(2, 1, 2, 2) for k in ("v_theta", "v_old", "x_t", "x0", "v_ref")}
    for adv, beta, kl_beta in (([2.5, -1.0], 0.5, 0.3), ([7.0, -9.0], 1.0, 0.0), ([0.0, 1.0], 0.1, 1e-4)):
        loss, _ = nft_loss(
            **kwargs,
            t=tens["t"],
            adv=torch.tensor(adv, dtype=torch.float64),
            beta=beta,
            adv_clip_max=5.0,
            kl_beta=kl_beta,
        )
        assert float(loss) == pytest.approx(_plain_nft(case, adv, beta, 5.0, kl_beta), rel=1e-12)
    # a 5-D video latent gives the same number as the 4-D image layout
    video = {k: v.reshape(2, 1, 1, 2, 2) for k, v in kwargs.items()}
    loss4, _ = nft_loss(**kwargs, t=tens["t"], adv=torch.tensor([2.5, -1.0]), beta=0.5, adv_clip_max=5.0)
    loss5, _ = nft_loss(**video, t=tens["t"], adv=torch.tensor([2.5, -1.0]), beta=0.5, adv_clip_max=5.0)
    assert float(loss4) == pytest.approx(float(loss5), rel=1e-12)


def test_nft_gradient_zero_at_r_half_except_kl() -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (3, 2, 4, 4)
    v_old, x_t, x0, v_ref = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(4))
    t = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    kl_beta = 0.1
    v_theta = v_old.clone().requires_grad_(True)
    loss, _ = nft_loss(
        v_theta, v_old, x_t, x0, t, torch.zeros(3), beta=1.0, adv_clip_max=5.0, v_ref=v_ref, kl_beta=kl_beta
    )
    loss.backward()
    n = 2 * 4 * 4
    expected = kl_beta * 2 * (v_old - v_ref) / (n * 3)  # d/dv of mean_B mean_CHW (v - v_ref)^2
    torch.testing.assert_close(v_theta.grad, expected, rtol=1e-10, atol=1e-12)
    # away from r = 0.5 the policy part has a gradient (the check above is not vacuous)
    v_theta.grad = None
    loss, _ = nft_loss(v_theta, v_old, x_t, x0, t, torch.ones(3), beta=1.0, adv_clip_max=5.0)
    loss.backward()
    assert float(v_theta.grad.abs().max()) > 1e-3


def test_nft_loss_rejects_bad_input() -> None:
    c = _nft_case()
    with pytest.raises(ValueError, match="needs v_ref"):
        nft_loss(**c, adv=torch.zeros(2), beta=1.0, adv_clip_max=5.0, kl_beta=0.1)
    with pytest.raises(ValueError, match="t of shape"):
        nft_loss(**{**c, "t": torch.tensor([[0.5], [0.5]])}, adv=torch.zeros(2), beta=1.0, adv_clip_max=5.0)
    with pytest.raises(ValueError, match="x0 has shape"):
        nft_loss(**{**c, "x0": torch.zeros(2, 1, 1, 2)}, adv=torch.zeros(2), beta=1.0, adv_clip_max=5.0)


# ---------------------------------------------------------------- Flow-GRPO


def test_ppo_clip_by_hand() -> None:
    lp = torch.tensor([0.1, -0.2], dtype=torch.float64)
    loss, m = ppo_clip_loss(lp, torch.zeros(2, dtype=torch.float64), torch.tensor([1.0, -2.0]), 0.05)
    # sample 0: max(-e^0.1, -1.05) = -1.05; sample 1: max(2 e^-0.2, 2 * 0.95) = 1.9
    assert float(loss) == pytest.approx((-1.05 + 1.9) / 2, rel=1e-12)
    assert float(m["ratio_max"]) == pytest.approx(math.exp(0.1))
    assert float(m["ratio_min"]) == pytest.approx(math.exp(-0.2))
    assert float(m["ratio_mean"]) == pytest.approx((math.exp(0.1) + math.exp(-0.2)) / 2)
    assert float(m["clip_frac"]) == 1.0
    assert float(m["approx_kl"]) == pytest.approx(0.5 * (0.01 + 0.04) / 2)


def _ppo_grad(lp: float, adv: float, eps: float = 0.1) -> float:
    x = torch.tensor([lp], dtype=torch.float64, requires_grad=True)
    loss, _ = ppo_clip_loss(x, torch.zeros(1, dtype=torch.float64), torch.tensor([adv]), eps)
    loss.backward()
    return float(x.grad[0])


def test_ppo_clip_gradient_directions() -> None:
    big, small = math.log(1.5), math.log(0.5)  # ratio 1.5 > 1 + eps, ratio 0.5 < 1 - eps
    assert _ppo_grad(big, 2.0) == 0.0  # A > 0 and ratio above the range: clipped, no push further up
    assert _ppo_grad(small, -2.0) == 0.0  # A < 0 and ratio below the range: clipped, no push further down
    # the other side of each is not clipped: d/dlp (-A ratio) = -A ratio
    assert _ppo_grad(small, 2.0) == pytest.approx(-2.0 * 0.5)
    assert _ppo_grad(big, -2.0) == pytest.approx(2.0 * 1.5)
    assert _ppo_grad(math.log(1.05), 3.0) == pytest.approx(-3.0 * 1.05)  # inside the range


def test_gaussian_mean_kl_by_hand() -> None:
    mu = torch.tensor([[1.0, 3.0], [0.0, 0.0]]).reshape(2, 1, 1, 2)
    ref = torch.tensor([[0.0, 1.0], [1.0, -1.0]]).reshape(2, 1, 1, 2)
    # mean squared diff: [2.5, 1.0]
    assert gaussian_mean_kl(mu, ref, torch.tensor([1.0, 0.5])).tolist() == pytest.approx([1.25, 2.0])
    assert gaussian_mean_kl(mu, ref, 2.0).tolist() == pytest.approx([2.5 / 8, 1.0 / 8])
    with pytest.raises(ValueError, match="std > 0"):
        gaussian_mean_kl(mu, ref, 0.0)
    with pytest.raises(ValueError, match="shape \\[2\\]"):
        gaussian_mean_kl(mu, ref, torch.ones(3))


def test_drop_zero_std_groups() -> None:
    keep = drop_zero_std_groups(["a", "b", "a", "b", "c"], torch.tensor([1.0, 2.0, 1.0, 3.0, 4.0]))
    assert keep.tolist() == [False, True, False, True, False]
    with pytest.raises(ValueError, match="one prompt per reward"):
        drop_zero_std_groups(["a"], torch.zeros(2))
