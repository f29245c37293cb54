"""Keeps the service's child processes alive: worker processes and the embedded redis-server.

Workers: `workers.count` general ones (hosting the enabled rewards no `[[worker_groups]]` entry takes; none when
every reward is grouped) and `count` per group (`python -m reward_service.worker --group <index>`).
A thread checks every `TICK_S`:
- a worker that exited is restarted into the same group (at most `workers.restart_limit` times a minute; past
  that the service keeps running and /health reports the missing workers);
- a worker that exited with a code a restart would only repeat (`NO_RESTART_EXITS`: its rewards cannot be
  built, Redis refuses it) sets `fatal` and calls `on_fatal`, which stops the service: it exits with that
  message instead of serving a reward nobody scores;
- a dead embedded redis-server is restarted on the same port and data directory (the append-only file brings
  the queue back);
- workers without a heartbeat are reaped (their tasks requeued) even when no worker is left to do it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import redis

from reward_service.children import die_with_parent
from reward_service.config import ServiceConfig
from reward_service.embedded_redis import EmbeddedRedis
from reward_service.keys import Keys
from reward_service.lua import Scripts
from reward_service.worker import BAD_CONFIG_EXIT, NO_RESTART_EXITS, REDIS_URL_ENV, reap_dead_workers

log = logging.getLogger("reward_service.supervisor")

TICK_S = 0.5
STOP_TIMEOUT_S = 10.0


def worker_slots(config: ServiceConfig) -> list[str]:
    """The `--group` of every worker process to start: "general" x workers.count (when a reward is left for
    them), then each group's index x its count."""
    slots = ["general"] * config.workers.count if config.general_rewards() else []
    for index, group in enumerate(config.worker_groups):
        slots += [str(index)] * group.count
    return slots


class Supervisor:
    """Starts the worker processes of `worker_slots(config)` for the Redis at `redis_url` and watches them.

    `config_path` is the file the service read (`config.resolve_config_path`'s answer), handed to every worker
    as an absolute path. `fatal` is set (then `on_fatal` called) when a worker exits with a code in
    `NO_RESTART_EXITS`."""

    def __init__(
        self,
        config_path: str | Path,
        config: ServiceConfig,
        redis_url: str,
        embedded: EmbeddedRedis | None,
        *,
        key: bytes,
    ) -> None:
        self.config_path = str(Path(config_path).absolute())
        self.key = key
        self.config, self.redis_url, self.embedded = config, redis_url, embedded
        self.slots = worker_slots(config)
        self.workers: list[subprocess.Popen] = []
        self.restarts: deque[float] = deque()
        self.fatal: str | None = None
        self._forwarders: dict[int, threading.Thread] = {}
        self._errors: dict[int, str] = {}
        self.on_fatal: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def _spawn(self, group: str) -> subprocess.Popen:
        command = [
            sys.executable, "-m", "reward_service.worker",
            "--config", self.config_path,
            "--parent", str(os.getpid()),
            "--group", group,
        ]  # fmt: skip
        env = {**os.environ, REDIS_URL_ENV: self.redis_url}  # not on argv: a URL may hold a password
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=die_with_parent()
        )
        forward = threading.Thread(target=self._forward, args=(process,), name="worker-stderr", daemon=True)
        forward.start()
        self._forwarders[process.pid] = forward
        return process

    def _forward(self, process: subprocess.Popen) -> None:
        """Copy a worker's stderr to ours, line by line, remembering its last error line (for `fatal`)."""
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            sys.stderr.flush()
            if (
                ": error: " in line
            ):  # the worker's one-paragraph message (bad config, rewards that do not build)
                self._errors[process.pid] = line.split(": error: ", 1)[1].strip()
            elif " ERROR " in line:  # a logged error (Redis refusing it)
                self._errors[process.pid] = line.split(" ERROR ", 1)[1].strip()

    def start(self) -> Supervisor:
        self.workers = [self._spawn(group) for group in self.slots]
        self._thread.start()
        return self

    def _watch(self) -> None:
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=2)
        keys, scripts = Keys(self.config.redis_prefix), Scripts.register(client)
        next_reap = 0.0
        while not self._stop.wait(TICK_S):
            if self.embedded is not None and not self.embedded.alive():
                self._restart_redis()
            self._restart_workers()
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + self.config.workers.visibility_timeout_s / 2
                try:
                    reap_dead_workers(client, keys, self.config, scripts, self.key)
                except redis.RedisError as exc:
                    log.debug("reaper: %s", exc)

    def _restart_redis(self) -> None:
        assert self.embedded is not None
        log.error("embedded redis-server exited (%s); restarting it", self.embedded.log_tail(2))
        try:
            self.embedded.start()
        except (RuntimeError, OSError) as exc:
            log.error("restarting redis-server failed: %s", exc)

    def _restart_workers(self) -> None:
        for i, process in enumerate(self.workers):
            code = process.poll()
            if code is None or self._stop.is_set() or self.fatal is not None:
                continue
            if (
                code in NO_RESTART_EXITS
            ):  # a worker that refused its config (or was refused by Redis) would be again
                self._give_up(process.pid, self.slots[i], code)
                continue
            now = time.monotonic()
            while self.restarts and now - self.restarts[0] > 60:
                self.restarts.popleft()
            if len(self.restarts) >= self.config.workers.restart_limit:
                continue
            log.error("worker pid %d exited with code %s; starting a new one", process.pid, code)
            self.restarts.append(now)
            self.workers[i] = self._spawn(self.slots[i])

    def _give_up(self, pid: int, group: str, code: int) -> None:
        """Record why the service cannot run (`fatal`) and ask it to stop (`on_fatal`)."""
        why = "could not build its rewards" if code == BAD_CONFIG_EXIT else "was refused by Redis"
        forward = self._forwarders.get(pid)
        if forward is not None:
            forward.join(timeout=2.0)  # its last lines
        error = self._errors.get(pid, "(no error line; see its output above)").rstrip(".")
        self.fatal = (
            f"reward worker pid {pid} (--group {group}) {why} and exited with code {code}: {error}. The service "
            f"stops rather than serve rewards no worker scores: fix {self.config_path} (or what the worker's "
            "message names) and start sanarl-reward again."
        )
        log.error("%s", self.fatal)
        callback = self.on_fatal
        if callback is not None:
            callback()

    def stop(self) -> None:
        """Stop the watch thread and the workers (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for process in self.workers:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.workers:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
