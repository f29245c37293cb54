"""One combination path: the in-process `RewardFunction` and the reward service's client (`RemoteRewardFunction`)
both end in `sanarl.rewards.combine.combine_scores`, so equal scores give equal results, weights included; the
expected totals are re-derived here from the formula of docs/algorithms.md ("Advantages and reward combination")."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards.base import Reward
from sanarl.rewards.combine import RewardFailure, RewardFunction
from sanarl.rewards.remote import RemoteRewardError, RemoteRewardFunction

NAN = float("nan")
SCORES = {
    "sharp": {"edge": [0.2, 0.9, -0.4, NAN], "area": [1.0, 2.0, 3.0, 4.0]},
    "tone": {"tone": [0.5, 0.1, 0.3, 0.7]},
}
DEFAULT_KEYS = {"sharp": "edge", "tone": "tone"}


class _Fixed(Reward):
    """A reward returning the fixed scores of SCORES[name]."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.keys, self.default_key = name, tuple(SCORES[name]), DEFAULT_KEYS[name]

    def _score(self, images, prompts, metadata):
        return {key: torch.tensor(values) for key, values in SCORES[self.name].items()}


def _config(**kwargs) -> RemoteRewardConfig:
    fns = [
        RewardFnConfig(name="sharp", weight=2.0, clip_max=0.5),  # default key "edge"
        RewardFnConfig(name="tone", weight=-1.0),
    ]
    return RemoteRewardConfig(reward_fns=fns, **kwargs)


def _local(config: RemoteRewardConfig):
    fn = RewardFunction(config, rewards={name: _Fixed(name) for name in SCORES})
    return fn(torch.full((4, 3, 8, 8), 0.5), ["p"] * 4)


def _remote(config: RemoteRewardConfig, bad: list[bool] | None = None, scores=SCORES):
    fn = RemoteRewardFunction(config, enqueue_url="http://x", fetch_url="http://x", token="t", check=False)
    task = SimpleNamespace(uuid="u-1", batch=4, bad=torch.tensor(bad or [False] * 4))
    answers = {name: {"scores": scores[name], "default_key": DEFAULT_KEYS[name]} for name in scores}
    return fn._combine(task, answers)


def _expected(scale: float, low: float, high: float) -> list[float]:
    out = []
    for edge, tone in zip(SCORES["sharp"]["edge"], SCORES["tone"]["tone"], strict=True):
        weighted = min(edge, 0.5) * 2.0 + tone * -1.0 if not math.isnan(edge) else NAN
        out.append(min(max(weighted, low), high) * scale if not math.isnan(weighted) else NAN)
    return out


def test_local_and_remote_combine_the_same_scores_the_same_way():
    config = _config(scale=3.0, reward_clip_min=-0.25, reward_clip_max=0.75)
    local, remote = _local(config), _remote(config)
    expected = _expected(3.0, -0.25, 0.75)
    for result in (local, remote):
        assert result.total.tolist()[:3] == pytest.approx(expected[:3])
        assert result.nan_mask.tolist() == [False, False, False, True]
        assert set(result.per_key) == {"sharp/edge", "sharp/area", "tone/tone", "sharp", "tone", "avg"}
    for key in local.per_key:
        assert torch.equal(local.per_key[key].nan_to_num(9.0), remote.per_key[key].nan_to_num(9.0)), key


def test_the_service_client_drops_samples_with_non_finite_pixels():
    result = _remote(_config(), bad=[False, True, False, False])
    assert result.nan_mask.tolist() == [False, True, False, True]
    assert result.total[0].item() == pytest.approx(_expected(1.0, -math.inf, math.inf)[0])


def test_no_sample_left_names_the_source_and_raises_the_callers_error():
    with pytest.raises(
        RemoteRewardError, match=r"reward service task u-1: every one of the 4 samples.*pixels: 4"
    ):
        _remote(_config(), bad=[True] * 4)
    missing = {**SCORES, "tone": {"other": [0.0] * 4}}
    with pytest.raises(
        RewardFailure, match=r"task u-1: reward 'tone' returned keys \['other'\], not its score key"
    ):
        _remote(_config(), scores=missing)
