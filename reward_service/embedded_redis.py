"""The embedded redis-server, started when the config gives no `redis_url` (Cosmos-RL's embedded mode).

It binds 127.0.0.1 only, on `[redis] port` (0 = a free port), with the append-only file on when
`[redis] persistence = true`, so queued tasks survive a restart of redis-server: the supervisor restarts it with
the same port and data directory if it dies.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from reward_service.config import RedisConfig
from sanarl.errors import ConfigError

log = logging.getLogger("reward_service.redis")

READY_TIMEOUT_S = 15.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process; `url` is valid after `start`."""

    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        self.port = config.port or free_port()
        self.process: subprocess.Popen | None = None
        self._own_dir = not config.data_dir
        self.data_dir = Path(config.data_dir or tempfile.mkdtemp(prefix="sanarl-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The redis-server command line."""
        executable = shutil.which(self.config.executable)
        if executable is None:
            raise ConfigError(
                f"`{self.config.executable}` is not on PATH, and the config gives no redis_url: install Redis "
                "(`apt-get install -y redis-server`), set `redis.executable` to the binary, or point `redis_url` "
                "at a running Redis."
            )
        return [
            executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "yes" if self.config.persistence else "no",
            "--appendfsync", self.config.fsync,
            "--dir", str(self.data_dir),
            "--logfile", str(self.data_dir / "redis.log"),
            "--daemonize", "no",
        ]  # fmt: skip

    def start(self) -> None:
        """Start redis-server and wait until it answers PING (RuntimeError with its log otherwise)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if client.ping():
                    log.info("embedded redis-server on %s (data in %s)", self.url, self.data_dir)
                    return
            except redis.exceptions.BusyLoadingError:
                pass  # replaying the append-only file
            except redis.RedisError:
                pass
            time.sleep(0.05)
        self.stop(remove=False)
        raise RuntimeError(f"redis-server did not start on port {self.port}: {self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        path = self.data_dir / "redis.log"
        if not path.exists():
            return "(no log)"
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])

    def stop(self, remove: bool = True) -> None:
        """Stop redis-server (SIGTERM: it writes the append-only file), then remove a temporary data dir."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if remove and self._own_dir:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.data_dir)
