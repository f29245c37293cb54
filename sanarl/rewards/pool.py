"""Asynchronous scoring: rollout sampling of the next prompts overlaps scoring of the previous ones.

    with RewardPool(reward_fn, max_workers=1, deadline_s=600) as pool:
        pending = pool.submit(images, prompts, metadata)     # returns at once
        ...                                                   # sample the next batch meanwhile
        [result] = pool.gather([pending])                     # RewardResult, in submission order

Scoring runs in worker threads (torch and PIL release the GIL in their heavy ops). Each call has a deadline,
counted from the moment a worker starts it (a call still queued waits at most one more deadline for a worker):
past it, `result()` raises `RewardTimeout` naming the deadline and the knob, and the pool stops accepting work,
because a Python thread cannot be killed (workers are daemon threads, so a hung reward never blocks exit).
An exception raised by the scoring function (a `RewardFailure` naming the reward, for a `RewardFunction`) is
re-raised in the caller by `result()` / `gather()`.

Images are handed to the worker as they are (detached, not copied): do not modify them in place before their
result is gathered.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from sanarl.rewards.combine import RewardFailure, RewardResult

if TYPE_CHECKING:
    from sanarl.config.schema import Config

DEFAULT_DEADLINE_S = 600.0
"""Default per-call deadline in seconds (as `rollout.reward_deadline_s`)."""
DEADLINE_KEY = "rollout.reward_deadline_s"
WORKERS_KEY = "rollout.reward_workers"
SHUTDOWN_GRACE_S = 30.0
"""How long `close(wait=False)` still waits for the calls that are running (at most the deadline): a torch op
left running in a daemon thread while the interpreter exits aborts the process ("terminate called without an
active exception", exit code 134) instead of exiting with the error's code."""

ScoreFn = Callable[[torch.Tensor, list[str], list[dict[str, Any]] | None], RewardResult]


class RewardTimeout(RewardFailure, TimeoutError):
    """A scoring call ran past its deadline (or never got a worker within it)."""


class RewardFuture:
    """Handle of one submitted scoring call; `result()` waits for it under the pool's deadline."""

    def __init__(self, pool: RewardPool, index: int) -> None:
        self.index = index
        self.started_at: float | None = None
        """`time.perf_counter()` when a worker started the call (None while queued)."""
        self.finished_at: float | None = None
        """`time.perf_counter()` when the call returned or raised."""
        self._pool = pool
        self._future: Future = Future()
        self._started = threading.Event()

    def done(self) -> bool:
        """True once the call finished (result, exception or cancelled)."""
        return self._future.done()

    def cancel(self) -> bool:
        """Cancel a call that has not started; returns whether it was cancelled."""
        cancelled = self._future.cancel()
        if cancelled:
            self._started.set()
        return cancelled

    def result(self) -> RewardResult:
        """The call's RewardResult; re-raises its exception; RewardTimeout past the deadline."""
        deadline = self._pool.deadline_s
        if not self._started.wait(deadline):
            if self.cancel():
                raise self._pool._timed_out(self, "did not get a worker")
        if self._future.cancelled():
            return self._future.result()  # raises CancelledError
        assert self.started_at is not None
        remaining = max(self.started_at + deadline - time.perf_counter(), 0.0)
        try:
            return self._future.result(timeout=remaining)
        except TimeoutError:
            if self._future.done():  # the scoring function itself raised a TimeoutError
                raise
            raise self._pool._timed_out(self, "ran longer than") from None

    def _run(self, fn: ScoreFn, args: tuple) -> None:
        """Run the call (in a worker thread, or inside `submit` when the pool has no workers)."""
        if not self._future.set_running_or_notify_cancel():
            return
        self.started_at = time.perf_counter()
        self._started.set()
        try:
            value = fn(*args)
        except BaseException as exc:  # handed to the caller by result()
            self.finished_at = time.perf_counter()
            self._future.set_exception(exc)
        else:
            self.finished_at = time.perf_counter()
            self._future.set_result(value)


class RewardPool:
    """Thread pool for `fn(images, prompts, metadata) -> RewardResult` (usually a `RewardFunction`).

    Args:
        fn: the scoring function.
        max_workers: concurrent scoring calls; 1 already overlaps scoring with sampling; 0 scores synchronously
            inside `submit` (no thread, no deadline: a synchronous call cannot be interrupted).
        deadline_s: per-call deadline in seconds (> 0), counted from the call's start.
        knob: the config key of the deadline, quoted in the timeout message.
    """

    def __init__(
        self,
        fn: ScoreFn,
        max_workers: int = 1,
        deadline_s: float = DEFAULT_DEADLINE_S,
        knob: str = DEADLINE_KEY,
    ) -> None:
        if int(max_workers) < 0:
            raise ValueError(f"RewardPool needs max_workers >= 0, got {max_workers}; set {WORKERS_KEY} >= 0.")
        if not deadline_s > 0:
            raise ValueError(
                f"RewardPool needs deadline_s > 0, got {deadline_s}; set {knob} to a positive number."
            )
        self.fn, self.max_workers, self.deadline_s, self.knob = fn, int(max_workers), float(deadline_s), knob
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[RewardFuture] = []
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._stopped: str | None = None
        self._threads = [
            threading.Thread(target=self._work, name=f"sanarl-reward-{i}", daemon=True)
            for i in range(self.max_workers)
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def from_config(cls, fn: ScoreFn, cfg: Config) -> RewardPool:
        """A pool with `rollout.reward_workers` threads and the `rollout.reward_deadline_s` deadline."""
        return cls(fn, cfg.rollout.reward_workers, cfg.rollout.reward_deadline_s, knob=DEADLINE_KEY)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, args = item
            future._run(self.fn, args)

    def submit(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> RewardFuture:
        """Queue one scoring call and return its future at once (with no workers: score it now)."""
        with self._lock:
            if self._stopped is not None:
                raise RewardFailure(f"the reward pool no longer accepts work: {self._stopped}")
            future = RewardFuture(self, next(self._counter))
            self._pending = [f for f in self._pending if not f.done()] + [future]
        images = images.detach() if isinstance(images, torch.Tensor) else images
        meta = None if metadata is None else list(metadata)
        args = (images, list(prompts), meta)
        if self._threads:
            self._queue.put((future, args))
        else:
            future._run(self.fn, args)
        return future

    def gather(self, futures: Iterable[RewardFuture]) -> list[RewardResult]:
        """Results of `futures` in the order given; the first failure (in that order) is raised."""
        return [future.result() for future in futures]

    def _timed_out(self, future: RewardFuture, what: str) -> RewardTimeout:
        """Stop the pool after a timeout and build the error for the caller."""
        names = "+".join(getattr(self.fn, "names", ())) or getattr(
            self.fn, "__name__", "the scoring function"
        )
        message = (
            f"reward scoring call #{future.index} ({names}) {what} the deadline of {self.deadline_s:g} s. If the "
            f"rewards are just slow (large batches, model loading), raise the deadline ({self.knob}); otherwise a "
            "reward hangs (e.g. a reward service that does not answer). The pool was stopped."
        )
        self._stop(f"call #{future.index} timed out")
        return RewardTimeout(message)

    def _stop(self, reason: str) -> None:
        """Refuse new work and cancel queued calls; running calls finish on their own."""
        with self._lock:
            if self._stopped is None:
                self._stopped = reason
            pending, self._pending = self._pending, []
        for future in pending:
            future.cancel()
        for _ in self._threads:
            self._queue.put(None)

    def close(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop the workers. `wait`: block until queued and running calls finish (unless they were cancelled or
        the pool timed out); without it, running calls still get `SHUTDOWN_GRACE_S` (bounded by the deadline) to
        finish. `cancel_pending`: drop calls that have not started. A timed-out pool joins nothing (its call hangs;
        the workers are daemon threads)."""
        timed_out = self._stopped is not None
        if cancel_pending:
            self._stop("the pool was closed")
        else:
            with self._lock:
                self._stopped = self._stopped or "the pool was closed"
            for _ in self._threads:
                self._queue.put(None)
        if timed_out:
            return
        end = None if wait else time.monotonic() + min(self.deadline_s, SHUTDOWN_GRACE_S)
        for thread in self._threads:
            thread.join(None if end is None else max(0.0, end - time.monotonic()))

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(wait=exc_type is None, cancel_pending=exc_type is not None)
