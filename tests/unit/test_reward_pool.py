"""RewardPool: asynchronous scoring equals synchronous scoring, keeps order, overlaps, times out, re-raises."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from sanarl.config.schema import Config, RemoteRewardConfig, RewardFnConfig
from sanarl.rewards import (
    Reward,
    RewardFailure,
    RewardFunction,
    RewardInputError,
    RewardPool,
    RewardResult,
    RewardTimeout,
)
from sanarl.worlds import shapes as world


class SleepyReward(Reward):
    """Score = image mean; sleeps `seconds` first, or blocks until `gate` is set when given one."""

    name = "sleepy"
    keys = ("score",)
    default_key = "score"

    def __init__(self, seconds: float = 0.0, gate: threading.Event | None = None, fail: bool = False) -> None:
        super().__init__()
        self.seconds, self.gate, self.fail = seconds, gate, fail

    def _score(self, images, prompts, metadata):
        if self.gate is not None:
            self.gate.wait(10.0)
        time.sleep(self.seconds)
        if self.fail:
            raise OSError("connection reset by the reward service")
        return {"score": images.mean(dim=(1, 2, 3))}


def sleepy_fn(**kwargs) -> RewardFunction:
    cfg = RemoteRewardConfig(reward_fns=[RewardFnConfig(name="sleepy", weight=2.0)])
    return RewardFunction(cfg, rewards={"sleepy": SleepyReward(**kwargs)})


def shapes_batches() -> list[tuple[torch.Tensor, list[str], list[dict]]]:
    """Three batches of different sizes (1, 2, 3) of shapes-world renders and noise."""
    rows = world.list_prompts("train")["position"][:6]
    gen = torch.Generator().manual_seed(0)
    batches, start = [], 0
    for size in (1, 2, 3):
        part = rows[start : start + size]
        arrays = np.stack([world.render(r, 32, seed=i) for i, r in enumerate(part)])
        images = torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255.0
        images[-1] = torch.rand(3, 32, 32, generator=gen)  # the last of each batch fails the judge
        batches.append((images, [r["prompt"] for r in part], part))
        start += size
    return batches


def test_pool_results_equal_synchronous_scoring_in_submission_order() -> None:
    cfg = RemoteRewardConfig(
        reward_fns=[
            RewardFnConfig(name="shapes", weight=1.0),
            RewardFnConfig(name="jpeg_compressibility", weight=10.0),
        ],
        scale=0.5,
    )
    fn = RewardFunction(cfg)
    batches = shapes_batches()
    expected = [fn(*batch) for batch in batches]
    with RewardPool(fn, max_workers=2, deadline_s=30.0) as pool:
        results = pool.gather([pool.submit(*batch) for batch in batches])
    assert [r.total.shape[0] for r in results] == [1, 2, 3]
    for got, want in zip(results, expected, strict=True):
        assert isinstance(got, RewardResult)
        assert torch.equal(got.total, want.total) and torch.equal(got.nan_mask, want.nan_mask)
        assert got.per_key.keys() == want.per_key.keys()
        assert all(torch.equal(got.per_key[k], want.per_key[k]) for k in want.per_key)
    assert results[2].per_key["shapes"].tolist()[:2] == [1.0, 1.0]  # renders pass, noise does not
    assert results[2].per_key["shapes"][2] < 1.0


def test_scoring_overlaps_the_caller_and_other_calls() -> None:
    fn = sleepy_fn(seconds=0.2)
    images = torch.full((2, 3, 4, 4), 0.25)
    with RewardPool(fn, max_workers=2, deadline_s=10.0) as pool:
        start = time.perf_counter()
        futures = [pool.submit(images, ["a", "b"]) for _ in range(4)]
        submitted = time.perf_counter() - start
        results = pool.gather(futures)
        wall = time.perf_counter() - start
    assert submitted < 0.1  # submit returns at once: the caller keeps sampling while scoring runs
    assert all(r.total.tolist() == [0.5, 0.5] for r in results)
    spans = sorted((f.started_at, f.finished_at) for f in futures)
    # two workers: the second call starts before the first one ends
    assert spans[1][0] < spans[0][1]
    assert max(end - begin for begin, end in spans) >= 0.19
    assert wall < 0.75  # sequential scoring would take 0.8 s; two workers take about 0.4 s


def test_slow_reward_times_out_quickly_naming_deadline_and_knob() -> None:
    gate = threading.Event()
    pool = RewardPool(sleepy_fn(gate=gate), deadline_s=0.05)
    try:
        future = pool.submit(torch.zeros(1, 3, 4, 4), ["p"])
        queued = pool.submit(torch.zeros(1, 3, 4, 4), ["q"])
        start = time.perf_counter()
        with pytest.raises(RewardTimeout) as err:
            future.result()
        assert time.perf_counter() - start < 1.0
        msg = str(err.value)
        assert "call #0 (sleepy) ran longer than the deadline of 0.05 s" in msg
        assert "raise the deadline (rollout.reward_deadline_s)" in msg
        assert isinstance(err.value, TimeoutError) and isinstance(err.value, RewardFailure)
        assert queued.done()  # queued work was cancelled with the pool
        with pytest.raises(RewardFailure, match="no longer accepts work: call #0 timed out"):
            pool.submit(torch.zeros(1, 3, 4, 4), ["r"])
    finally:
        gate.set()
        pool.close(wait=False)


def test_deadline_counts_from_the_start_of_each_call() -> None:
    # 6 calls of 0.1 s on one worker: the last one ends 0.6 s after submission, but each runs well under 0.35 s
    fn = sleepy_fn(seconds=0.1)
    with RewardPool(fn, max_workers=1, deadline_s=0.35) as pool:
        results = pool.gather([pool.submit(torch.ones(1, 3, 2, 2), [f"p{i}"]) for i in range(6)])
    assert [r.total.item() for r in results] == [2.0] * 6


def test_exceptions_are_reraised_in_the_caller_with_the_reward_name() -> None:
    with RewardPool(sleepy_fn(fail=True), deadline_s=10.0) as pool:
        future = pool.submit(torch.zeros(1, 3, 4, 4), ["p"])
        with pytest.raises(RewardFailure, match="reward 'sleepy' failed.*OSError: connection reset") as err:
            pool.gather([future])
    assert isinstance(err.value.__cause__, OSError)
    cfg = RemoteRewardConfig(reward_fns=[RewardFnConfig(name="shapes")])
    with RewardPool(RewardFunction(cfg), deadline_s=10.0) as pool:
        future = pool.submit(torch.zeros(1, 3, 32, 32), ["a cat on a sofa"], [{}])
        with pytest.raises(RewardInputError, match="prompt 'a cat on a sofa'"):
            future.result()


def test_context_manager_waits_for_queued_calls_on_success() -> None:
    with RewardPool(sleepy_fn(seconds=0.05), max_workers=1) as pool:
        futures = [pool.submit(torch.zeros(1, 3, 2, 2), ["p"]) for _ in range(3)]
    assert all(f.done() and not f._future.cancelled() for f in futures)
    assert all(not t.is_alive() for t in pool._threads)


def test_context_manager_cancels_queued_calls_on_error() -> None:
    gate = threading.Event()
    with pytest.raises(KeyboardInterrupt):
        with RewardPool(sleepy_fn(gate=gate), max_workers=1) as pool:
            running = pool.submit(torch.zeros(1, 3, 2, 2), ["p"])
            queued = [pool.submit(torch.zeros(1, 3, 2, 2), ["q"]) for _ in range(2)]
            while running.started_at is None:
                time.sleep(0.005)
            threading.Timer(0.2, gate.set).start()  # the running call ends while the pool closes
            raise KeyboardInterrupt
    assert running.result().total.tolist() == [0.0]  # the running call still completes
    assert all(f._future.cancelled() for f in queued)


def test_closing_after_an_error_waits_for_the_running_call() -> None:
    # a reward worker left inside torch while the interpreter exits aborts the process (exit 134)
    with pytest.raises(KeyboardInterrupt):
        with RewardPool(sleepy_fn(seconds=0.3), max_workers=1) as pool:
            running = pool.submit(torch.zeros(1, 3, 2, 2), ["p"])
            queued = pool.submit(torch.zeros(1, 3, 2, 2), ["q"])
            while running.started_at is None:
                time.sleep(0.005)
            raise KeyboardInterrupt
    assert running.done() and not any(t.is_alive() for t in pool._threads)
    assert queued._future.cancelled()


def test_pool_arguments_are_checked() -> None:
    fn = sleepy_fn()
    with pytest.raises(ValueError, match="rollout.reward_workers >= 0"):
        RewardPool(fn, max_workers=-1)
    with pytest.raises(ValueError, match="deadline_s > 0"):
        RewardPool(fn, deadline_s=0)


def test_zero_workers_score_synchronously_from_config() -> None:
    cfg = Config()
    cfg.rollout.reward_workers, cfg.rollout.reward_deadline_s = 0, 5.0
    calls: list[str] = []

    def fn(images, prompts, metadata):
        calls.append(threading.current_thread().name)
        return sleepy_fn()(images, prompts, metadata)

    with RewardPool.from_config(fn, cfg) as pool:
        assert (pool.max_workers, pool.deadline_s) == (0, 5.0)
        future = pool.submit(torch.full((1, 3, 2, 2), 0.5), ["p"])
        assert future.done() and calls == [threading.current_thread().name]  # ran inside submit
        assert future.result().total.tolist() == [1.0]
