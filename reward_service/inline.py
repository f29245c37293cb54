"""Scoring inside the API process (`[workers] inline = true`): no Redis, no worker processes.

The shortest way a request can take: the API parses the body, a scoring thread of the same process scores it
with the workers' `score_tasks` (same batching, same numbers, same result JSON), and the waiting pull is woken on
the event loop. With Redis and worker processes a request crosses four process boundaries more (API -> Redis ->
worker -> Redis -> API), each a wake-up and a copy; here it crosses none.

The HTTP answers are the queue broker's (broker.py): the same statuses and bodies, limits, request-id rules and
deadline. What differs, by design:
- tasks and results live in this process's memory: a restart loses them, and a pull of a lost task gets the 404
  an expired one gets (sanarl's client then enqueues the images again);
- one process serves: no other instance or worker shares its queue (`redis_url` and `[[worker_groups]]` are
  refused with it, `[redis]` and the worker-process settings are not used);
- `limits.max_queue_bytes` counts the pixels of the requests not yet scored (there is no Redis memory to read).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from reward_service.batch_scoring import Outcome, Task, score_tasks
from reward_service.broker import (
    Answer,
    QueueFull,
    RequestIdConflict,
    deadline_error,
    latency_figures,
    pending_answer,
    stored_answer,
    task_count,
    unknown_answer,
)
from reward_service.config import LimitsConfig, ServiceConfig
from reward_service.signing import BodyDigests
from reward_service.wire_format import EnqueueRequest, decode_array
from sanarl.rewards.base import Reward

log = logging.getLogger("reward_service.inline")

LATENCY_SAMPLES = 256
"""Recent (end-to-end, scoring) seconds kept per reward for /health, as many as the queue broker keeps."""


@dataclass
class _Request:
    """One enqueued request: its tasks (one per reward) and their answers as they come."""

    uuid: str
    request: EnqueueRequest | None  # dropped once every reward has answered (the pixels are not needed again)
    digests: BodyDigests | None  # the body's, until the scoring thread has taken its request digest
    created: float  # time.monotonic() of the enqueue
    request_id: str
    digest: str = ""  # what a repeated request id is compared with (`body_digest`)
    answers: dict[str, Answer] = field(default_factory=dict)
    waiters: dict[str, set[asyncio.Future]] = field(default_factory=lambda: collections.defaultdict(set))

    @property
    def names(self) -> list[str]:
        return list(self.request.rewards) if self.request is not None else list(self.answers)

    def body_digest(self) -> str:
        """The request digest of the body (`BodyDigests.request`), hashed here if the scoring thread has not yet."""
        digests = self.digests  # read once: the scoring thread sets `digest` first, then clears `digests`
        return self.digest if digests is None else digests.request

    def keep_digest(self) -> None:
        """Hash the request digest and let go of the body (scoring thread, after the batch is handed back)."""
        digests = self.digests
        if digests is not None:
            self.digest = digests.request
            self.digests = None


class InlineBroker:
    """The API's broker when the API scores: `rewards` ({name: Reward}, models loaded) are scored on one thread,
    at most `batch_images` images per call; `frames` gives each reward's (video_frame_stride,
    video_frame_reduction). Same methods as `broker.AsyncBroker` as far as the endpoints use them."""

    def __init__(
        self,
        rewards: dict[str, Reward],
        limits: LimitsConfig,
        batch_images: int,
        frames: dict[str, tuple[int, str]],
    ) -> None:
        self.rewards, self.limits, self.batch_images, self.frames = rewards, limits, batch_images, frames
        self._requests: dict[str, _Request] = {}
        self._request_ids: dict[str, str] = {}  # request id -> uuid, while the request is kept
        self._expiry: collections.deque[tuple[float, str]] = collections.deque()  # (expires, uuid), in order
        self._queues: dict[str, collections.deque[str]] = {name: collections.deque() for name in rewards}
        self._running: dict[str, int] = dict.fromkeys(rewards, 0)
        self._latency = {name: collections.deque(maxlen=LATENCY_SAMPLES) for name in rewards}
        self._pending = 0  # (request, reward) tasks queued or being scored
        self._queued_bytes = 0
        self._wake = threading.Condition()
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.info = {
            "id": f"{socket.gethostname()}-{os.getpid()}-inline",
            "rewards": sorted(rewards),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "inline": True,
        }

    # --- life ----------------------------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the scoring thread; answers are handed to `loop` (the API's event loop)."""
        self._loop = loop
        self._thread = threading.Thread(target=self._score_forever, name="inline-scoring", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the scoring thread after the call it is in (tasks still queued are dropped with the process)."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- what the endpoints call ----------------------------------------------------------------------------
    async def served_rewards(self) -> set[str]:
        return set(self.rewards)

    async def without_worker(self, names: list[str]) -> list[str]:
        """The rewards of `names` nothing here scores: all of them once the scoring thread has died."""
        hosted = set(self.rewards) if self.alive() else set()
        return sorted(set(names) - hosted)

    async def enqueue(self, request: EnqueueRequest, digests: BodyDigests) -> str:
        """Queue one task per reward; the uuid (the existing one for a repeated request id, whose body must have
        the same `digests.request`). Nothing is signed: the tasks never leave this process. Raises QueueFull (429)
        or RequestIdConflict (409)."""
        self._expire()
        if request.request_id and request.request_id in self._request_ids:
            existing = self._request_ids[request.request_id]
            if self._requests[existing].body_digest() != digests.request:
                raise RequestIdConflict(existing)
            return existing
        self._check_room(request)
        entry = _Request(str(uuidlib.uuid4()), request, digests, time.monotonic(), request.request_id or "")
        self._requests[entry.uuid] = entry
        if request.request_id:
            self._request_ids[request.request_id] = entry.uuid
        with self._wake:
            for name in request.rewards:
                self._queues[name].append(entry.uuid)
            self._pending += len(request.rewards)
            self._queued_bytes += len(request.npy)
        asyncio.get_running_loop().call_soon(self._notify)
        return entry.uuid

    def _notify(self) -> None:
        """Wake the scoring thread. Called on the loop's next step, once the enqueue answer is written: woken
        earlier, the thread would contend with the endpoint for the GIL and start no sooner (docs/results.md,
        "Reward service")."""
        with self._wake:
            self._wake.notify()

    async def pull(self, task_uuid: str, reward: str, wait_s: float) -> Answer:
        """The answer now, waiting up to `wait_s` (capped by limits.max_pull_wait_s) while the task is pending."""
        loop = asyncio.get_running_loop()
        until = loop.time() + max(0.0, min(wait_s, self.limits.max_pull_wait_s))
        ident = {"uuid": task_uuid, "type": reward}
        self._expire()
        entry = self._requests.get(task_uuid)
        if entry is None:
            return unknown_answer(ident, self.limits)
        if reward not in entry.names:
            return unknown_answer(ident, self.limits, entry.names)
        while reward not in entry.answers:
            age = time.monotonic() - entry.created
            if age > self.limits.task_deadline_s:
                self._settle(entry, reward, _failed(ident, deadline_error(reward, self.limits, age)))
                entry.keep_digest()  # the scoring thread may never take this request now
                break
            left = until - loop.time()
            if left <= 0:
                return pending_answer(ident, age)
            # set by _settle, or by the timer: a plain await wakes in one loop step
            done = loop.create_future()
            timer = loop.call_later(min(left, self.limits.task_deadline_s - age + 0.01), _wake, done)
            entry.waiters[reward].add(done)
            try:
                await done
            finally:
                timer.cancel()
                entry.waiters[reward].discard(done)
        return entry.answers[reward]

    async def figures(self, enabled: list[str]) -> dict[str, Any]:
        """What /health reports, in the queue broker's form: this process is the one worker."""
        alive = self.alive()
        rewards = {
            name: {
                "workers": int(alive),
                "queued": len(self._queues[name]),
                "running": self._running[name],
                "latency_s": latency_figures(list(self._latency[name])),
                "keys": list(reward.keys),
                "default_key": reward.default_key,
            }
            for name, reward in self.rewards.items()
        }
        return {"rewards": rewards, "workers": [{**self.info, "alive": alive}], "pending": self._pending}

    # --- bookkeeping on the event loop ----------------------------------------------------------------------
    def _check_room(self, request: EnqueueRequest) -> None:
        limits = self.limits
        if self._pending + len(request.rewards) > limits.max_pending_tasks:
            raise QueueFull(
                f"the queue is full ({self._pending} of limits.max_pending_tasks = {limits.max_pending_tasks} "
                "tasks pending); retry later."
            )
        if limits.max_queue_bytes and self._queued_bytes + len(request.npy) > limits.max_queue_bytes:
            raise QueueFull(
                f"the requests waiting to be scored hold {self._queued_bytes} bytes of pixels; with this one "
                f"({len(request.npy)} bytes) that is more than limits.max_queue_bytes = {limits.max_queue_bytes}; "
                "retry later."
            )

    def _settle(self, entry: _Request, reward: str, answer: Answer) -> bool:
        """Store the first answer of (request, reward), wake its pulls; once every reward has answered, drop
        the pixels and start the result's time to live. False when the task had its answer already."""
        if reward in entry.answers or entry.request is None:
            return False
        entry.answers[reward] = answer
        self._pending -= 1
        for waiter in entry.waiters.get(reward, ()):
            _wake(waiter)
        if len(entry.answers) == len(entry.request.rewards):
            with self._wake:  # the scoring thread reads `request` under this lock
                self._queued_bytes -= len(entry.request.npy)
                for name in entry.request.rewards:  # a task failed by its deadline may still be queued
                    if entry.uuid in self._queues[name]:
                        self._queues[name].remove(entry.uuid)
                entry.request = None
            self._expiry.append((time.monotonic() + self.limits.result_ttl_s, entry.uuid))
        return True

    def _expire(self) -> None:
        """Forget requests whose results have outlived limits.result_ttl_s (their request ids with them)."""
        now = time.monotonic()
        while self._expiry and self._expiry[0][0] <= now:
            entry = self._requests.pop(self._expiry.popleft()[1], None)
            if entry is not None and entry.request_id:
                self._request_ids.pop(entry.request_id, None)

    # --- the scoring thread ---------------------------------------------------------------------------------
    def _score_forever(self) -> None:
        try:
            self._score_until_stopped()
        except BaseException:  # /health then shows no live worker and enqueue answers 503, naming the rewards
            log.exception("the scoring thread stopped; restart the service")
            raise

    def _score_until_stopped(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not any(self._queues.values()):
                    self._wake.wait()
                if self._stop:
                    return
                batches = {name: self._take(name) for name in self.rewards}
            for name, taken in batches.items():
                if taken:
                    self._score(name, taken)

    def _take(self, name: str) -> list[tuple[_Request, Task | str]]:
        """Queued requests of `name` up to batch_images images (at least one), each with its Task, or the error
        it fails with (past its deadline, pixels unreadable). Runs under the lock."""
        taken: list[tuple[_Request, Task | str]] = []
        images, queue = 0, self._queues[name]
        while queue and (not taken or images < self.batch_images):
            entry = self._requests.get(queue[0])
            if entry is None or entry.request is None or name in entry.answers:
                queue.popleft()
                continue
            count = task_count(entry.request.header)
            if taken and images + count > self.batch_images:
                break
            queue.popleft()
            images += count
            taken.append((entry, self._task(name, entry)))
        self._running[name] += len(taken)
        return taken

    def _task(self, name: str, entry: _Request) -> Task | str:
        """The Task of (request, reward), or the error it fails with."""
        request = entry.request
        assert request is not None
        age = time.monotonic() - entry.created
        if age > self.limits.task_deadline_s:
            return deadline_error(name, self.limits, age)
        stride, reduction = self.frames[name]
        frames = request.header.get("frames", {}).get(name, {})
        try:
            array = decode_array(request.npy, request.header["shape"])
        except ValueError as exc:
            return f"reward {name!r}: the request's pixels are unreadable: {exc}"
        return Task(
            f"{name}|{entry.uuid}|{task_count(request.header)}",
            request.header,
            array,
            0,
            frames.get("video_frame_stride", stride),
            frames.get("video_frame_reduction", reduction),
        )

    def _score(self, name: str, taken: list[tuple[_Request, Task | str]]) -> None:
        """Score one batch of `name` and hand every answer to the event loop."""
        tasks = [task for _, task in taken if isinstance(task, Task)]
        try:
            outcomes = score_tasks(self.rewards[name], tasks) if tasks else {}
        except Exception as exc:  # score_tasks answers a reward's own errors; this is anything else
            log.exception("scoring a batch of %s failed", name)
            error = f"reward {name!r} failed: {type(exc).__name__}: {exc}"
            outcomes = {task.item: Outcome(error=error) for task in tasks}
        answers = []
        for entry, task in taken:
            ident = {"uuid": entry.uuid, "type": name}
            outcome = outcomes[task.item] if isinstance(task, Task) else Outcome(error=task)
            if outcome.result is not None:
                answer = stored_answer({"status": "done", "result": outcome.result}, ident)
                timing = (time.monotonic() - entry.created, float(outcome.result["duration"]))
            else:
                answer, timing = _failed(ident, outcome.error or "unknown error"), None
            answers.append((entry, answer, timing))
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver, name, answers)
        for entry, _ in taken:  # off the request's path: hashlib lets go of the GIL while the loop answers
            entry.keep_digest()

    def _deliver(self, name: str, answers: list[tuple[_Request, Answer, tuple[float, float] | None]]) -> None:
        """Settle a scored batch on the event loop; /health's latency counts the results kept (a task its
        deadline failed meanwhile keeps that failure, as a result written once in Redis does)."""
        with self._wake:
            self._running[name] -= len(answers)
        for entry, answer, timing in answers:
            if self._settle(entry, name, answer) and timing is not None:
                self._latency[name].appendleft(timing)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _failed(ident: dict[str, str], error: str) -> Answer:
    return stored_answer({"status": "failed", "error": error}, ident)


def inline_broker(config: ServiceConfig) -> InlineBroker:
    """The InlineBroker of a service config: every enabled reward built and loaded on its device, in this
    process (`workers.torch_threads` applied first). Raises UserError naming the entry that fails."""
    from reward_service.rewards_setup import build_rewards

    if config.workers.torch_threads:
        import torch

        torch.set_num_threads(config.workers.torch_threads)
    rewards = build_rewards(config, load=True)
    frames = {
        name: (config.reward_entry(name).video_frame_stride, config.reward_entry(name).video_frame_reduction)
        for name in rewards
    }
    return InlineBroker(rewards, config.limits, config.workers.batch_images, frames)
