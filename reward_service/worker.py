"""A reward worker process: takes tasks from Redis, scores them in batches, writes results with a TTL.

    python -m reward_service.worker --config rewards.toml --redis-url redis://127.0.0.1:6379/0 [--group G]

`sanarl-reward` starts `workers.count` general workers (`--group general`: the enabled rewards no
`[[worker_groups]]` entry takes) and `count` workers per group (`--group <index>`: that group's rewards on its
device); more can run on other machines against the same Redis (default `--group all`: every enabled reward).

Reliability (at-least-once, no task lost): a task is claimed by moving its queue item into this worker's
processing list in one Lua step; a heartbeat thread refreshes `hb:<worker>` every third of the visibility
timeout. A worker that dies (kill -9, OOM, machine loss) stops beating; after the visibility timeout any worker
or the supervisor of any instance moves its items back to their queues (lua.REAP). Results are written once,
signed with a key derived from the service's token (signing.py), so a worker needs the token too (`token` in
the config or REMOTE_REWARD_TOKEN).

Loop: claim every hosted reward's queued tasks (up to `workers.batch_images` images per reward; the claim script
also returns the tasks' headers and pixels, one round trip), score them, finish them; when nothing is queued,
block on the rewards' wake lists (BLPOP, woken by every enqueue) for at most a second, then reap dead workers
if it is time to. A claim never waits to fill a batch: tasks queued while a batch is scored form the next one.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid as uuidlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from reward_service.batch_scoring import Outcome, Task, score_tasks
from reward_service.config import ServiceConfig, load_service_config
from reward_service.keys import TASK_UUID, WAKE_CAP, Keys, split_item
from reward_service.lua import Scripts, execute, queue_script
from reward_service.signing import genuine, pixels_digest, result_key, sign, task_signature
from reward_service.wire_format import decode_array
from sanarl.errors import ConfigError, UserError

log = logging.getLogger("reward_service.worker")

MAX_CLAIM = 256
"""Most tasks taken per reward in one claim."""
BLOCK_S = 1.0
"""Longest sleep on the wake lists before the loop re-checks the queues, the parent and dead workers."""
REDIS_URL_ENV = "SANARL_REWARD_REDIS_URL"
"""Environment variable with the Redis URL (the service passes it this way, not on the command line)."""
BAD_CONFIG_EXIT = 2
"""Exit code of a worker that cannot build its rewards (the supervisor does not restart it)."""
REDIS_REFUSED_EXIT = 3
"""Exit code of a worker whose commands Redis keeps refusing (the supervisor does not restart it)."""
NO_RESTART_EXITS = (BAD_CONFIG_EXIT, REDIS_REFUSED_EXIT)
"""Exit codes that a restart would only repeat."""
TRANSIENT_REDIS_ERRORS = (
    redis.exceptions.ConnectionError,  # includes BusyLoadingError (a restarting server reading its dump)
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a failover in progress
    redis.exceptions.TryAgainError,
    redis.exceptions.NoScriptError,  # a restarted server lost the scripts; they are re-sent
)
"""Redis errors of an outage, a restart or a failover: retried with back-off for as long as they last."""
REFUSED_REDIS_ERRORS = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
"""Subclasses of ConnectionError that no outage explains (wrong password, missing rights)."""


def is_transient(exc: redis.RedisError) -> bool:
    """True for errors of an outage, restart or failover (`TRANSIENT_REDIS_ERRORS`), not for refusals."""
    return isinstance(exc, TRANSIENT_REDIS_ERRORS) and not isinstance(exc, REFUSED_REDIS_ERRORS)


REFUSALS_BEFORE_EXIT = 5
"""Other Redis errors (a wrong password, missing ACL rights, a server that rejects a command) in a row before
the worker stops retrying and exits with `REDIS_REFUSED_EXIT`."""


class RedisRefused(RuntimeError):
    """Redis answered but refused the worker's commands `REFUSALS_BEFORE_EXIT` times in a row."""


def poison_failures(key: bytes, items: list[str], max_attempts: int) -> str:
    """The signed failure of each held item, for REAP to store when its task reached `max_attempts` deaths."""
    failures = {}
    for item in items:
        name, task_uuid, _ = split_item(item)
        error = (
            f"the worker scoring this task died {max_attempts} times (workers.max_attempts = {max_attempts}): "
            f"reward {name} crashes its process on this input (out of memory?); see the service log."
        )
        message = json.dumps({"status": "failed", "type": name, "error": error})
        failures[item] = sign(key, task_uuid, name, message)
    return json.dumps(failures)


def reap_dead_workers(
    client: redis.Redis, keys: Keys, config: ServiceConfig, scripts: Scripts, key: bytes
) -> int:
    """Requeue the tasks of every registered worker without a heartbeat (failing those that reached
    workers.max_attempts, with a failure signed with `key`); returns how many were requeued."""
    total = 0
    for raw in client.hkeys(keys.workers):
        wid = raw.decode()
        if client.exists(keys.heartbeat(wid)):
            continue
        held = [item.decode() for item in client.lrange(keys.proc(wid), 0, -1)]
        moved = scripts.reap(
            keys=[keys.proc(wid), keys.heartbeat(wid), keys.workers, keys.pending],
            args=[
                wid,
                keys.prefix,
                config.workers.max_attempts,
                int(config.limits.result_ttl_s),
                keys.channel,
                WAKE_CAP,
                poison_failures(key, held, config.workers.max_attempts),
            ],
        )
        if moved > 0:
            log.warning("worker %s is dead (no heartbeat): %d task(s) handed back to the queue", wid, moved)
        total += max(moved, 0)
    return total


class StopFlag:
    """A stop request that a signal handler may set.

    `threading.Event.set` takes the event's lock; a SIGTERM handler calling it while the main thread sits in
    `Event.wait` (the back-off after a Redis error, which is exactly when a dying service's redis-server goes
    away) deadlocks the worker for good. Setting this flag takes no lock; `wait` polls it.
    """

    POLL_S = 0.05

    def __init__(self) -> None:
        self._requested = False

    def set(self) -> None:
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout: float) -> bool:
        """Sleep until the flag is set or `timeout` seconds pass; True if it is set."""
        deadline = time.monotonic() + timeout
        while not self._requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(self.POLL_S, left))
        return self._requested


class Worker:
    """Scores the tasks of `rewards` ({name: Reward}, models loaded) from the Redis behind `client`, at most
    `batch_images` images per scoring call (0 = `workers.batch_images`); results are signed with `key`
    (`signing.result_key` of the service's token)."""

    def __init__(
        self,
        config: ServiceConfig,
        rewards: dict[str, Any],
        client: redis.Redis,
        parent: int = 0,
        batch_images: int = 0,
        *,
        key: bytes,
    ) -> None:
        self.config, self.rewards, self.client, self.parent = config, rewards, client, parent
        self.key = key
        self.batch_images = batch_images or config.workers.batch_images
        self.frames = {
            name: (
                config.reward_entry(name).video_frame_stride,
                config.reward_entry(name).video_frame_reduction,
            )
            for name in rewards
        }
        self.keys = Keys(config.redis_prefix)
        self.scripts = Scripts.register(client)
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuidlib.uuid4().hex[:6]}"
        self.stop = StopFlag()
        self.info = json.dumps(
            {
                "rewards": sorted(rewards),
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
            }
        )
        self._next_reap = 0.0
        self._woken: tuple[str, str] | None = None  # (reward, uuid) of the wake-up token the worker last got
        self._hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pixels-digest")

    # --- registration and heartbeat ---------------------------------------------------------------------------
    def beat(self) -> None:
        """Refresh the heartbeat and the registry entry (re-created if a reaper removed it during an outage)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.workers, self.id, self.info)
        pipe.set(self.keys.heartbeat(self.id), "1", px=int(self.config.workers.visibility_timeout_s * 1000))
        pipe.execute()

    def register(self) -> None:
        """Publish the hosted rewards' keys and start beating."""
        from reward_service.rewards_setup import reward_info

        for name, reward in self.rewards.items():
            self.client.hset(self.keys.rewards, name, json.dumps(reward_info(reward)))
        self.beat()
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        period = self.config.workers.visibility_timeout_s / 3
        while not self.stop.wait(period):
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed (%s); retrying", exc)

    def unregister(self) -> None:
        """Leave cleanly: drop the heartbeat and hand back anything still held."""
        self.client.delete(self.keys.heartbeat(self.id))
        self.scripts.reap(
            keys=[
                self.keys.proc(self.id),
                self.keys.heartbeat(self.id),
                self.keys.workers,
                self.keys.pending,
            ],
            args=[
                self.id,
                self.keys.prefix,
                1 << 30,
                int(self.config.limits.result_ttl_s),
                self.keys.channel,
                WAKE_CAP,
                "{}",
            ],
        )

    # --- main loop --------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until `stop` is set or the parent process is gone; survives Redis outages.

        Raises:
            RedisRefused: after `REFUSALS_BEFORE_EXIT` non-transient Redis errors in a row.
        """
        backoff, recover, refusals = 0.1, False, 0
        while not self.stop.is_set():
            if self.parent and os.getppid() != self.parent:
                log.warning("parent process %d is gone; worker %s exits", self.parent, self.id)
                return
            try:
                if recover:
                    self.recover_held()
                    recover = False
                if not self.step():
                    self._woken = self._wait_for_work()
                self._maybe_reap()
                backoff, refusals = 0.1, 0
            except redis.RedisError as exc:
                refusals = 0 if is_transient(exc) else refusals + 1
                if refusals >= REFUSALS_BEFORE_EXIT:
                    raise RedisRefused(
                        f"Redis refused worker {self.id}'s commands {refusals} times in a row, last with "
                        f"{type(exc).__name__}: {exc}. This is not an outage: check the password and ACL "
                        f"rights in the Redis URL (--redis-url or ${REDIS_URL_ENV}) and that the server runs "
                        "Redis >= 6.2 with Lua scripting enabled."
                    ) from exc
                log.warning("Redis error in worker %s: %s; retrying in %.1f s", self.id, exc, backoff)
                self.stop.wait(backoff)
                backoff, recover = min(backoff * 2, 5.0), True

    def recover_held(self) -> None:
        """After a Redis error: finish what is still in this worker's processing list (a claim whose answer was
        lost, or a finish that did not reach Redis). Tasks already finished are only dropped."""
        held: dict[str, list[str]] = {}
        for raw in self.client.lrange(self.keys.proc(self.id), 0, -1):
            item = raw.decode()
            held.setdefault(split_item(item)[0], []).append(item)
        for name, items in held.items():
            if name in self.rewards:
                log.info("worker %s recovers %d held task(s) of %s", self.id, len(items), name)
                self.process(name, *self._load(name, items))

    def _maybe_reap(self) -> None:
        if time.monotonic() >= self._next_reap:
            self._next_reap = time.monotonic() + self.config.workers.visibility_timeout_s / 2
            reap_dead_workers(self.client, self.keys, self.config, self.scripts, self.key)

    def _wait_for_work(self) -> tuple[str, str] | None:
        """Block on the rewards' wake lists (at most BLOCK_S); (reward, uuid) of the token taken, if any."""
        names = {self.keys.wake(n).encode(): n for n in self.rewards}
        woken = self.client.blpop(list(names), timeout=BLOCK_S)
        if not woken or woken[0] not in names:
            return None
        return names[woken[0]], woken[1].decode(errors="replace")

    def step(self) -> bool:
        """Claim and score what is queued for each hosted reward; True when anything was claimed."""
        worked, woken, self._woken = False, self._woken, None
        for name in self.rewards:
            out, prefetched = self._claim(name, woken[1] if woken and woken[0] == name else "")
            if out:
                worked = True
                self.process(name, float(out[0]), self._with_pixels(out[1:], prefetched))
        return worked

    def _claim(self, name: str, woken_uuid: str) -> tuple[list, dict[str, bytes | None]]:
        """The claim script's answer for `name`; after a wake-up token naming a request, that request's pixels
        are read in the same round trip ({uuid: pixels}, usually the task claimed)."""
        keys = [self.keys.queue(name), self.keys.proc(self.id)]
        args = [self.batch_images, MAX_CLAIM, self.keys.prefix, name]
        if not TASK_UUID.fullmatch(woken_uuid):
            return self.scripts.claim(keys=keys, args=args), {}

        def build(pipe: Any) -> None:
            queue_script(pipe, self.scripts.claim, keys, args)
            pipe.get(self.keys.blob(woken_uuid))

        out, pixels = execute(self.client, self.scripts, build)
        return out, {woken_uuid: pixels}

    def _with_pixels(self, claimed: list, prefetched: dict[str, bytes | None]) -> list[tuple]:
        """The claim script's rows as `_load` returns them, with their pixels (None where gone): those read
        with the claim, the others with one MGET."""
        items = [raw[0].decode() for raw in claimed]
        uuids = [split_item(item)[1] for item in items]
        missing = [u for u in uuids if u not in prefetched]
        if missing:
            read = self.client.mget([self.keys.blob(u) for u in missing])
            prefetched = {**prefetched, **dict(zip(missing, read, strict=True))}
        blobs = [prefetched[u] for u in uuids]
        return [
            (item, header, created, attempts, blob, stored, signature)
            for item, (_, header, created, attempts, stored, signature), blob in zip(
                items, claimed, blobs, strict=True
            )
        ]

    def process(self, name: str, now: float, rows: list[tuple]) -> None:
        """Score the live tasks of `rows` (as `_load` returns them), then finish every one.

        The signature check hashes the pixels on a second thread while the batch is scored (hashlib releases the
        GIL); a task whose check fails gets the signature failure in place of its score, which is never stored."""
        digests = {row[0]: self._hashing.submit(pixels_digest, row[4]) for row in rows if row[4] is not None}
        tasks, finished = self._tasks(name, now, rows)
        if tasks:
            finished.update(score_tasks(self.rewards[name], tasks))
        for item, header, _, _, _, _, signature in rows:
            if finished.get(item) is not None:
                task_uuid = split_item(item)[1]
                if not _signed_by_api(self.key, task_uuid, header, digests[item].result(), signature):
                    finished[item] = _refused(name, task_uuid)
        signed = {item: self._signed(name, item, outcome) for item, outcome in finished.items()}

        def build(pipe: Any) -> None:
            for item, (message, status, seconds) in signed.items():
                self._finish(pipe, name, item, message, status, seconds)

        stored_all = execute(self.client, self.scripts, build)
        for (item, (message, status, seconds)), stored in zip(signed.items(), stored_all, strict=True):
            if stored == -1:
                self._replace_forged(name, item, message, status, seconds)

    def _replace_forged(self, name: str, item: str, message: str, status: str, seconds: float) -> None:
        """Another value sits where this result goes: keep it when this service signed it (the task was scored
        twice), else log it and store the real result in its place."""
        _, task_uuid, _ = split_item(item)
        current = self.client.get(self.keys.result(task_uuid, name))
        if current is not None and genuine(self.key, task_uuid, name, current):
            return
        if current is None:  # it expired or was deleted meanwhile: store ours as usual
            current = b""
        else:
            log.error(
                "the stored result of task %s (%s) was not signed by this service (forged, or written with "
                "another token); replacing it with the scored result. Check who can write to this Redis.",
                task_uuid,
                name,
            )
        execute(
            self.client,
            self.scripts,
            lambda pipe: self._finish(pipe, name, item, message, status, seconds, current),
        )

    def _load(self, name: str, items: list[str]) -> tuple[float, list[tuple]]:
        """Redis time and one row `(item, header, created, attempts, npy, stored result, signature)` per held item
        (None where a key is gone), as the claim script returns them."""
        pipe = self.client.pipeline(transaction=False)
        for item in items:
            _, task_uuid, _ = split_item(item)
            pipe.hmget(self.keys.task(task_uuid), "header", "created", f"a:{name}", "sig")
            pipe.get(self.keys.blob(task_uuid))
            pipe.get(self.keys.result(task_uuid, name))
        pipe.time()
        out = pipe.execute()
        sec, usec = out[-1]
        rows = []
        for i, item in enumerate(items):
            (header, created, attempts, signature), blob, stored = out[3 * i : 3 * i + 3]
            rows.append((item, header, created, attempts, blob, stored, signature))
        return sec + usec / 1e6, rows

    def _tasks(
        self, name: str, now: float, rows: list[tuple]
    ) -> tuple[list[Task], dict[str, Outcome | None]]:
        """Tasks to score, and the items settled without scoring: None = drop (finished elsewhere, or the request
        expired), else the failure (deadline passed, pixels unreadable). A stored result this service did not sign
        does not count as finished: the task is scored and the result replaces it. The request's signature is
        checked by `process`."""
        tasks: list[Task] = []
        settled: dict[str, Outcome | None] = {}
        deadline = self.config.limits.task_deadline_s
        for item, header, created, attempts, blob, stored, _ in rows:
            task_uuid = split_item(item)[1]
            done = stored is not None and genuine(self.key, task_uuid, name, stored)
            waited = _seconds_since(created, now)
            if done or header is None or blob is None:
                settled[item] = None
            elif waited is None:  # `created` is not signed: changed in Redis to a non-time, it fails the task
                settled[item] = Outcome(
                    error=f"reward {name!r}: stored task unreadable: created = {created!r}"
                )
            elif waited > deadline:
                error = (
                    f"reward {name!r}: no worker took this task within limits.task_deadline_s = {deadline:g} s "
                    f"(it waited {waited:.1f} s); the service is overloaded."
                )
                settled[item] = Outcome(error=error)
            else:
                try:
                    tasks.append(self._task(name, item, header, attempts, blob))
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    settled[item] = Outcome(error=f"reward {name!r}: stored task unreadable: {exc!r}")
        return tasks, settled

    def _task(self, name: str, item: str, header: bytes, attempts: bytes | None, blob: bytes) -> Task:
        """The Task of one row's stored header and pixels. Raises ValueError, KeyError, TypeError or AttributeError
        where they are unreadable: the signature is not checked yet (`process` does, while scoring), so this reads
        data that may have been changed in Redis and must fail as a task, never stop the worker."""
        meta = json.loads(header)
        array = decode_array(blob, meta["shape"])
        if meta["media_type"] not in ("image", "video") or not isinstance(meta["prompts"], list):
            raise ValueError(f"media_type {meta['media_type']!r} or prompts are not what the API stores")
        stride, reduction = self.frames[name]
        frames = meta.get("frames", {}).get(name, {})
        stride = frames.get("video_frame_stride", stride)
        reduction = frames.get("video_frame_reduction", reduction)
        return Task(item, meta, array, int(attempts or 0), stride, reduction)

    def _signed(self, name: str, item: str, outcome: Outcome | None) -> tuple[str, str, float]:
        """(signed stored value, status, scoring seconds) of an outcome; ("", "", 0) = only drop the item."""
        if outcome is None:
            return "", "", 0.0
        if outcome.result is not None:
            message = json.dumps({"status": "done", "result": outcome.result}, allow_nan=False)
            status, seconds = "done", outcome.result["duration"]
        else:
            message = json.dumps({"status": "failed", "type": name, "error": outcome.error})
            status, seconds = "failed", 0.0
        return sign(self.key, split_item(item)[1], name, message), status, seconds

    def _finish(
        self, pipe: Any, name: str, item: str, message: str, status: str, seconds: float, replace: bytes = b""
    ) -> None:
        """Queue the FINISH script on `pipe`: write the signed result (or failure) once - in place of `replace`,
        a forged value, when given -, drop the item, notify."""
        _, task_uuid, _ = split_item(item)
        queue_script(
            pipe,
            self.scripts.finish,
            [
                self.keys.proc(self.id),
                self.keys.result(task_uuid, name),
                self.keys.task(task_uuid),
                self.keys.blob(task_uuid),
                self.keys.pending,
                self.keys.latency(name),
            ],
            [
                item,
                message,
                int(self.config.limits.result_ttl_s),
                status,
                self.keys.channel,
                f"{task_uuid}|{name}",
                name,
                seconds,
                replace,
            ],
        )


def _seconds_since(created: bytes | None, now: float) -> float | None:
    """Seconds from a task's stored `created` (Redis time) to `now`; None when it is not a finite number."""
    try:
        waited = now - float(created)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return waited if math.isfinite(waited) else None


def _signed_by_api(key: bytes, task_uuid: str, header: bytes, pixels: bytes, signature: bytes | None) -> bool:
    """True when the task's header and pixels (`pixels`: their `signing.pixels_digest`) are those the API signed
    at enqueue."""
    expected = task_signature(key, task_uuid, header, pixels).encode()
    return signature is not None and hmac.compare_digest(signature, expected)


def _refused(name: str, task_uuid: str) -> Outcome:
    """The failure of a task whose stored prompts or pixels fail their signature check (logged)."""
    log.error(
        "task %s (%s): its stored prompts / pixels fail their signature check; refused", task_uuid, name
    )
    return Outcome(
        error=f"reward {name!r}: the request's stored data (prompts, pixels) fails its signature check: it was "
        "changed in Redis after enqueue, so no score of it is stored. Check who can write to the service's Redis."
    )


def _hosted(config: ServiceConfig, group: str) -> tuple[list[str], str, int]:
    """(reward names, device override, batch_images override) of `--group` all | general | <index>."""
    if group == "all":
        return [e.reward_type for e in config.enabled_rewards()], "", 0
    if group == "general":
        return config.general_rewards(), "", 0
    if not group.isdigit() or int(group) >= len(config.worker_groups):
        raise ConfigError(
            f"--group {group!r}: use all, general, or an index of the {len(config.worker_groups)} "
            f"[[worker_groups]] entries of {config.source}."
        )
    entry = config.worker_groups[int(group)]
    return list(entry.rewards), entry.device, entry.batch_images


def _check_hosted(names: list[str], group: str, source: str) -> None:
    if not names:
        raise ConfigError(
            f"--group {group}: every enabled reward of {source} belongs to a [[worker_groups]] entry, so a general "
            "worker has nothing to host; start a group's worker (--group <index>) instead."
        )


def main(argv: list[str] | None = None) -> None:
    """Worker entry point (started by `sanarl-reward`; can also run by hand on another machine)."""
    parser = argparse.ArgumentParser(
        prog="python -m reward_service.worker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", required=True, help="the service's rewards.toml")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get(REDIS_URL_ENV, ""),
        help=f"redis://host:port/db shared with the service (default: ${REDIS_URL_ENV})",
    )
    parser.add_argument(
        "--parent", type=int, default=0, help="exit when this parent pid is gone (set by the service)"
    )
    parser.add_argument(
        "--group",
        default="all",
        help="rewards to host: all (default), general (those in no [[worker_groups]]), or a group index",
    )
    args = parser.parse_args(argv)
    if not args.redis_url:
        parser.error(f"give --redis-url or set {REDIS_URL_ENV}")
    try:
        config = load_service_config(args.config)
        key = result_key(config.resolved_token())  # results are signed with the service's token
        logging.basicConfig(
            level=config.log_level.upper(),
            format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s %(message)s",
        )
        if config.workers.torch_threads:
            import torch

            torch.set_num_threads(config.workers.torch_threads)
        from reward_service.rewards_setup import build_rewards

        names, device, batch_images = _hosted(config, args.group)
        _check_hosted(names, args.group, config.source)
        rewards = build_rewards(config, load=True, names=names, device=device)
    except UserError as exc:
        sys.stderr.write(f"reward worker {os.getpid()}: error: {exc}\n")
        sys.exit(BAD_CONFIG_EXIT)
    client = redis.Redis.from_url(args.redis_url, socket_timeout=30)
    worker = Worker(config, rewards, client, args.parent, batch_images, key=key)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop.set())
    worker.register()
    log.info("worker %s serving %s", worker.id, sorted(rewards))
    code = 0
    try:
        worker.run()
    except RedisRefused as exc:
        log.error("%s", exc)
        code = REDIS_REFUSED_EXIT
    finally:
        try:
            worker.unregister()
        except redis.RedisError as exc:
            log.warning("could not unregister worker %s: %s", worker.id, exc)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter teardown (seconds with torch and models loaded)


if __name__ == "__main__":
    main()
