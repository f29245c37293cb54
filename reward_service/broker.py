"""Server-side Redis access (asyncio): enqueue, the state of a task, waiting for a result, health figures.

Every state change is one Lua script (lua.py); reads are pipelined. Completion notifications arrive on one
pub/sub subscription per server process and carry the stored result, so a waiting pull answers without reading
Redis again; waiters re-check every `RECHECK_S` anyway, so a missed message (a Redis reconnect) costs at most
that much latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid as uuidlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError, ResponseError

from reward_service.config import LimitsConfig, WorkersConfig
from reward_service.keys import WAKE_CAP, Keys, queue_item, split_item
from reward_service.lua import Scripts, aexecute, queue_script
from reward_service.signing import BodyDigests, ForgedResult, open_result, sign, task_signature
from reward_service.wire_format import EnqueueRequest

log = logging.getLogger("reward_service.broker")

RECHECK_S = 0.5
"""A waiting pull re-reads the task at least this often."""
REWARDS_CACHE_S = 2.0
"""How long the set of rewards served anywhere is cached for the enqueue check."""
LIVE_CACHE_S = 1.0
"""How long the set of rewards some live worker hosts is cached for the enqueue check (a miss re-reads it)."""
MEMORY_CACHE_S = 0.2
"""How long Redis' used memory is cached for the max_queue_bytes check."""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status code and JSON body."""

    status: int
    body: dict[str, Any]


PENDING_STATUS = 400
"""Status of a pending pull: non-2xx so Cosmos-RL's clients (which retry until 200) keep polling, as with
Cosmos-RL's own service; the body says `"status": "pending"`."""


REFUSED_STATUS = 502
"""Status of a pull whose stored result fails its signature check (never served); clients retry 5xx."""


class QueueFull(Exception):
    """max_pending_tasks or max_queue_bytes reached; the message says which."""


class RequestIdConflict(Exception):
    """A request id was reused with a different body."""


def task_count(header: dict[str, Any]) -> int:
    """Images a reward scores for one request: B, or B * T for videos."""
    shape = header["shape"]
    return int(shape[0]) * (int(shape[2]) if header["media_type"] == "video" else 1)


class AsyncBroker:
    """The server's view of the queue. `client` is a `redis.asyncio.Redis` (decode_responses=False); results are
    served only when their signature checks out with `key` (`signing.result_key` of the token)."""

    def __init__(
        self, client: Any, keys: Keys, limits: LimitsConfig, workers: WorkersConfig, *, key: bytes
    ) -> None:
        self.client, self.keys, self.limits, self.workers = client, keys, limits, workers
        self.key = key
        self.scripts = Scripts.register(client)
        self._waiters: dict[str, set[asyncio.Future]] = defaultdict(set)
        self._served: tuple[float, set[str]] = (0.0, set())
        self._live: tuple[float, set[str]] = (0.0, set())
        self._forged: set[tuple[str, str]] = set()
        self._memory: tuple[float, int] = (0.0, 0)

    @property
    def ttl(self) -> int:
        """TTL of a request's data and of its request id: deadline + result TTL (whole seconds)."""
        return int(self.limits.task_deadline_s + self.limits.result_ttl_s) + 1

    async def served_rewards(self) -> set[str]:
        """Rewards some worker (of any instance) registered, cached for REWARDS_CACHE_S."""
        stamp, names = self._served
        if time.monotonic() - stamp > REWARDS_CACHE_S:
            names = {k.decode() for k in await self.client.hkeys(self.keys.rewards)}
            self._served = (time.monotonic(), names)
        return names

    async def live_rewards(self) -> set[str]:
        """Rewards hosted by a registered worker (of any instance) whose heartbeat is alive."""
        workers = await self.client.hgetall(self.keys.workers)
        ids = list(workers)
        pipe = self.client.pipeline(transaction=False)
        for wid in ids:
            pipe.exists(self.keys.heartbeat(wid.decode()))
        beats = await pipe.execute() if ids else []
        live: set[str] = set()
        for wid, beat in zip(ids, beats, strict=True):
            if beat:
                live.update(json.loads(workers[wid]).get("rewards", []))
        return live

    async def without_worker(self, names: list[str]) -> list[str]:
        """The rewards of `names` no live worker hosts (a cached answer is trusted only when it has them all)."""
        stamp, live = self._live
        if time.monotonic() - stamp > LIVE_CACHE_S or not set(names) <= live:
            live = await self.live_rewards()
            self._live = (time.monotonic(), live)
        return sorted(set(names) - live)

    async def _check_memory(self) -> None:
        """QueueFull while Redis uses more than limits.max_queue_bytes (cached for MEMORY_CACHE_S)."""
        limit = self.limits.max_queue_bytes
        if not limit:
            return
        stamp, used = self._memory
        if time.monotonic() - stamp > MEMORY_CACHE_S:
            used = int((await self.client.info("memory"))["used_memory"])
            self._memory = (time.monotonic(), used)
        if used > limit:
            raise QueueFull(
                f"Redis holds {used} bytes, more than limits.max_queue_bytes = {limit}: the queued pixels wait for "
                "workers; retry later."
            )

    async def enqueue(self, request: EnqueueRequest, digests: BodyDigests) -> str:
        """Queue one task per reward, signed with `digests.pixels`; returns the uuid (the existing one for a
        repeated request id, whose body must have the same `digests.request`).

        Raises QueueFull (429), RequestIdConflict (409) or RedisError (503)."""
        await self._check_memory()
        task_uuid = str(uuidlib.uuid4())
        digest = digests.request
        kind, value = await self._queue(task_uuid, request, digests.pixels, digest)
        if kind == "full":
            raise QueueFull(
                f"the queue is full ({value} of limits.max_pending_tasks = {self.limits.max_pending_tasks} tasks "
                "pending); retry later."
            )
        if kind == "dup":
            existing, _, old_digest = value.partition("|")
            if old_digest != digest:
                raise RequestIdConflict(existing)
            return existing
        if kind == "lost":
            raise RedisError("Redis did not keep the request's pixels (its SET failed)")
        return value

    async def _queue(
        self, task_uuid: str, request: EnqueueRequest, pixels: bytes, digest: str
    ) -> tuple[str, str]:
        """Store the pixels with a plain SET, then run lua.ENQUEUE on them in the same round trip; its answer."""
        header_json = json.dumps(request.header, separators=(",", ":")).encode()
        blob = self.keys.blob(task_uuid)
        keys = [
            self.keys.task(task_uuid),
            blob,
            self.keys.request_id(request.request_id or "-"),
            self.keys.pending,
        ]
        args = [
            task_uuid,
            header_json,
            task_count(request.header),
            self.limits.max_pending_tasks,
            self.ttl,
            digest if request.request_id else "",
            self.keys.prefix,
            json.dumps(list(request.rewards)),
            WAKE_CAP,
            task_signature(self.key, task_uuid, header_json, pixels),
        ]

        def build(pipe: Any) -> None:
            pipe.set(blob, request.npy, ex=self.ttl)
            queue_script(pipe, self.scripts.enqueue, keys, args)

        try:
            _, out = await aexecute(self.client, self.scripts, build)
        except ResponseError:  # refused (e.g. Redis out of memory): drop the pixels, then answer 503
            with contextlib.suppress(RedisError):
                await self.client.delete(blob)
            raise
        return out[0].decode(), out[1].decode()

    async def state(self, task_uuid: str, reward: str) -> Answer:
        """The answer to a pull right now (done 200, failed 500, unknown 404, pending PENDING_STATUS)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.result(task_uuid, reward))
        pipe.hmget(self.keys.task(task_uuid), "created", "n", "rewards")
        pipe.time()
        stored, (created, count, rewards), (sec, usec) = await pipe.execute()
        ident = {"uuid": task_uuid, "type": reward}
        if stored is not None:
            return self._answer(stored, ident)
        if created is None:
            return unknown_answer(ident, self.limits)
        names = json.loads(rewards)
        if reward not in names:
            return unknown_answer(ident, self.limits, names)
        try:
            age = sec + usec / 1e6 - float(created)
        except ValueError:  # `created` changed in Redis (not signed): pending here, the worker fails the task
            age = math.nan
        if age > self.limits.task_deadline_s:
            await self._fail(task_uuid, reward, int(count), age)
            return await self.state(task_uuid, reward)
        return pending_answer(ident, age)

    async def _fail(self, task_uuid: str, reward: str, count: int, age: float) -> None:
        """Fail a task past its deadline (queued, or held by a worker that is too slow)."""
        error = deadline_error(reward, self.limits, age)
        message = sign(
            self.key, task_uuid, reward, json.dumps({"status": "failed", "type": reward, "error": error})
        )
        await self.scripts.fail_task(
            keys=[
                self.keys.task(task_uuid),
                self.keys.result(task_uuid, reward),
                self.keys.queue(reward),
                self.keys.pending,
                self.keys.blob(task_uuid),
            ],
            args=[
                queue_item(reward, task_uuid, count),
                message,
                int(self.limits.result_ttl_s),
                reward,
                self.keys.channel,
                f"{task_uuid}|{reward}",
            ],
        )

    async def pull(self, task_uuid: str, reward: str, wait_s: float) -> Answer:
        """`state`, waiting up to `wait_s` (capped by limits.max_pull_wait_s) while the task is pending."""
        loop = asyncio.get_running_loop()
        until = loop.time() + max(0.0, min(wait_s, self.limits.max_pull_wait_s))
        key = f"{task_uuid}|{reward}"
        while True:
            done: asyncio.Future = loop.create_future()
            self._waiters[key].add(done)
            try:
                answer = await self.state(task_uuid, reward)
                left = until - loop.time()
                if answer.status != PENDING_STATUS or left <= 0:
                    return answer
                try:
                    stored = await asyncio.wait_for(done, timeout=min(RECHECK_S, left))
                except asyncio.TimeoutError:
                    continue
                if stored:
                    answer = self._answer(stored, {"uuid": task_uuid, "type": reward})
                    if answer.status != REFUSED_STATUS:
                        return answer  # a forged notification: re-read the task instead
            finally:
                self._waiters[key].discard(done)
                if not self._waiters[key]:
                    self._waiters.pop(key, None)

    async def figures(self, enabled: list[str]) -> dict[str, Any]:
        """What /health reports: `health_figures`."""
        return await health_figures(self, enabled)

    def _answer(self, stored: bytes, ident: dict[str, str]) -> Answer:
        """The answer of a stored result; REFUSED_STATUS (and an error in the log) when its signature fails."""
        try:
            return stored_answer(open_result(self.key, ident["uuid"], ident["type"], stored), ident)
        except ForgedResult as exc:
            if (
                len(self._forged) < 1024 and (ident["uuid"], ident["type"]) not in self._forged
            ):  # once per task
                self._forged.add((ident["uuid"], ident["type"]))
                log.error("%s: refused (not served). Something other than this service's workers wrote it into "
                          "Redis (or a worker runs with another token); check who can write to this Redis.", exc)  # fmt: skip
            error = (
                f"{exc}: it was not written by this service's workers, so it is refused; the worker scoring the "
                "task replaces it. Retry, and check who can write to the service's Redis (see the service log)."
            )
            return Answer(REFUSED_STATUS, {"status": "refused", **ident, "error": error})

    def _notify(self, data: bytes) -> None:
        """Hand a completion message (`<uuid>|<reward>[\\n<stored JSON>]`) to the pulls waiting on that task."""
        key, _, stored = data.partition(b"\n")
        for waiter in self._waiters.get(key.decode(), ()):
            if not waiter.done():
                waiter.set_result(stored)

    async def listen(self) -> None:
        """Forward completion messages to waiting pulls; runs until cancelled, resubscribing after errors."""
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.keys.channel)
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        self._notify(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: retry; waiters re-check on their own meanwhile
                log.debug("pub/sub listener: %s; resubscribing", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


def stored_answer(stored: dict[str, Any], ident: dict[str, str]) -> Answer:
    """The answer of a finished task: 200 with its result, or 500 with its failure."""
    if stored.get("status") == "done":
        return Answer(200, stored["result"])
    return Answer(500, {"status": "failed", **ident, "error": stored.get("error", "unknown error")})


def unknown_answer(ident: dict[str, str], limits: LimitsConfig, names: list[str] | None = None) -> Answer:
    """404 for a uuid this service does not know (or no longer keeps), or (with `names`, the rewards the request
    asked for) a reward the request did not ask for."""
    task_uuid, reward = ident["uuid"], ident["type"]
    if names is None:
        error = (
            f"uuid {task_uuid!r} is unknown or expired (results are kept limits.result_ttl_s = "
            f"{limits.result_ttl_s:g} s); enqueue the images again."
        )
    else:
        error = f"uuid {task_uuid!r} was enqueued for {names}, not {reward!r}."
    return Answer(404, {"status": "unknown", **ident, "error": error})


def pending_answer(ident: dict[str, str], age: float) -> Answer:
    """PENDING_STATUS with the task's age in seconds (null when unknown)."""
    age_s = round(age, 3) if math.isfinite(age) else None
    return Answer(PENDING_STATUS, {"status": "pending", **ident, "age_s": age_s})


def deadline_error(reward: str, limits: LimitsConfig, age: float) -> str:
    """The failure of a task `age` seconds old that nothing scored within limits.task_deadline_s."""
    return (
        f"reward {reward!r} did not score this task within limits.task_deadline_s = {limits.task_deadline_s:g} s "
        f"(waited {age:.1f} s): the workers are overloaded, dead or stuck; check GET /health and the service log."
    )


async def health_figures(broker: AsyncBroker, enabled: list[str]) -> dict[str, Any]:
    """Workers (alive or not), per-reward queue depth / running / latency, and the pending count."""
    client, keys = broker.client, broker.keys
    workers = {k.decode(): json.loads(v) for k, v in (await client.hgetall(keys.workers)).items()}
    infos = {k.decode(): json.loads(v) for k, v in (await client.hgetall(keys.rewards)).items()}
    ids = sorted(workers)
    pipe = client.pipeline(transaction=False)
    for wid in ids:
        pipe.exists(keys.heartbeat(wid))
        pipe.lrange(keys.proc(wid), 0, -1)
    names = sorted(set(enabled) | set(infos))
    for name in names:
        pipe.llen(keys.queue(name))
        pipe.lrange(keys.latency(name), 0, -1)
    pipe.get(keys.pending)
    out = await pipe.execute()
    alive: dict[str, bool] = {}
    running: dict[str, int] = defaultdict(int)
    for i, wid in enumerate(ids):
        alive[wid] = bool(out[2 * i])
        for item in out[2 * i + 1]:
            running[split_item(item.decode())[0]] += 1
    base = 2 * len(ids)
    rewards = {}
    for j, name in enumerate(names):
        served_by = [w for w in ids if alive[w] and name in workers[w].get("rewards", [])]
        rewards[name] = {
            "workers": len(served_by),
            "queued": int(out[base + 2 * j]),
            "running": running[name],
            "latency_s": _latency(out[base + 2 * j + 1]),
            **infos.get(name, {}),
        }
    worker_rows = [{"id": w, "alive": alive[w], **workers[w]} for w in ids]
    return {"rewards": rewards, "workers": worker_rows, "pending": int(out[-1] or 0)}


def _latency(samples: list[bytes]) -> dict[str, float]:
    """`latency_figures` of the samples FINISH keeps (`b"<e2e>,<scoring>"`)."""
    return latency_figures([tuple(float(x) for x in s.decode().split(",")) for s in samples])


def latency_figures(pairs: Sequence[tuple[float, ...]]) -> dict[str, float]:
    """p50 / p99 of end-to-end seconds (enqueue -> result) and the mean scoring seconds of recent tasks, from
    `(end-to-end, scoring)` pairs."""
    if not pairs:
        return {"count": 0}
    e2e = sorted(p[0] for p in pairs)

    def pick(q: float) -> float:
        return round(e2e[min(len(e2e) - 1, int(q * len(e2e)))], 4)

    score = sum(p[1] for p in pairs) / len(pairs)
    return {"count": len(pairs), "p50": pick(0.5), "p99": pick(0.99), "score_mean": round(score, 4)}
