"""The embedded redis-server, started when the config gives no `redis_url` (Cosmos-RL's embedded mode).

It binds 127.0.0.1 only, on `[redis] port` (0 = a free port), requires a password (random unless `[redis]
password` is set), and dies with the service (a kill -9 included: children.py). With `[redis] persistence = true`
the append-only file lives in a persistent data folder (`[redis] data_dir`, else `default_data_dir`: one per API
address), so queued tasks survive a restart of redis-server (the supervisor restarts it with the same port and
folder if it dies) and a restart of the whole service (the next start on the same address replays the file).
Without persistence the folder is temporary: removed at exit, or at the next start when a kill -9 left it.

A data folder is used by one redis-server at a time: the service holds a lock file in it (flock, shared with its
redis-server child so that it lasts until that process has written its file and exited, a kill -9 of the service
included); a second service on the folder waits `LOCK_WAIT_S` for it, then stops with a ConfigError.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

import redis

from reward_service.children import die_with_parent
from reward_service.config import RedisConfig
from sanarl.errors import ConfigError

log = logging.getLogger("reward_service.redis")

READY_TIMEOUT_S = 15.0
LOCK_WAIT_S = 15.0
"""How long a start waits for the data folder's previous redis-server (a killed service's, still writing its
append-only file) to let go of it."""
STATE_ENV = "XDG_STATE_HOME"
"""Root of persistent per-user state (the freedesktop convention; default ~/.local/state)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DIR_PREFIX = "sanarl-redis-"
"""Temporary data directories are `<tmp>/sanarl-redis-<service pid>-<random>` (mode 0700)."""
LOCK_NAME = ".owner.lock"
"""A file in each temporary data directory that its service holds locked (flock) for as long as it runs: the
kernel drops the lock when the service dies, however it dies, so a lockable directory is stale."""


def _lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on `path` (created), or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def default_data_dir(host: str, port: int) -> Path:
    """The persistent data folder of the embedded Redis of a service listening on `host:port` (when `[redis]
    data_dir` is empty and persistence is on): `$XDG_STATE_HOME/sanarl/reward-service/redis-<host>-<port>`
    (~/.local/state without the variable). A service restarted on the same address finds its queue there."""
    root = Path(os.environ.get(STATE_ENV) or Path.home() / ".local" / "state")
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    return root / "sanarl" / "reward-service" / f"redis-{safe_host}-{port}"


def _wait_for_lock(path: Path, timeout: float) -> int | None:
    """`_lock(path)`, retried for `timeout` seconds (a previous redis-server may still be writing its file)."""
    deadline = time.monotonic() + timeout
    while True:
        fd = _lock(path)
        if fd is not None or time.monotonic() >= deadline:
            return fd
        time.sleep(0.1)


def remove_stale_dirs(root: Path | None = None) -> list[Path]:
    """Remove this user's temporary data directories whose service is gone (a service killed with -9 cannot
    remove its own): those whose lock file nobody holds; returns them."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        try:
            if not path.is_dir() or path.stat().st_uid != os.getuid() or not (path / LOCK_NAME).is_file():
                continue
            fd = _lock(path / LOCK_NAME)
        except OSError:
            continue
        if fd is not None:
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)
            removed.append(path)
    if removed:
        log.info("removed %d stale embedded-Redis folder(s) of services that were killed: %s", len(removed),
                 ", ".join(map(str, removed)))  # fmt: skip
    return removed


def _quote(value: str) -> str:
    """A redis.conf string (double-quoted, backslash and quote escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class EmbeddedRedis:
    """A redis-server child process; `url` is valid after `start`.

    It listens on 127.0.0.1 only and requires a password (`[redis] password`, else a random one per service
    start). The configuration, password included, reaches redis-server on its stdin (`redis-server -`): nothing
    secret is on a command line or in a file. The process gets SIGTERM if the service dies (children.py)."""

    def __init__(self, config: RedisConfig, default_dir: Path | None = None) -> None:
        """`default_dir`: the persistent data folder used when `[redis] data_dir` is empty and persistence is on
        (the service passes `default_data_dir` of its API address); None = a temporary folder then too."""
        self.config = config
        self.port = config.port or free_port()
        self.password = config.password or secrets.token_urlsafe(32)
        self.process: subprocess.Popen | None = None
        persistent = config.data_dir or (default_dir if config.persistence else None)
        self._own_dir = not persistent  # a temporary folder, removed at exit
        if self._own_dir:
            remove_stale_dirs()
            self.data_dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        else:
            self.data_dir = Path(persistent).expanduser().absolute()
        self._lock_fd: int | None = None

    def claim_folder(self) -> None:
        """Create the data folder (mode 0700) and take its lock (held until `stop`); ConfigError when another
        service's redis-server keeps it past LOCK_WAIT_S."""
        if self._lock_fd is not None:
            return
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.data_dir.chmod(0o700)
            fd = _wait_for_lock(self.data_dir / LOCK_NAME, 0.0 if self._own_dir else LOCK_WAIT_S)
        except OSError as exc:
            raise ConfigError(
                f"cannot use the embedded Redis data folder {self.data_dir} ({exc.strerror or exc}); set "
                "`[redis] data_dir` to a folder this user can write."
            ) from None
        if fd is None:
            raise ConfigError(
                f"the embedded Redis data folder {self.data_dir} is in use by another sanarl-reward (its "
                "redis-server holds the folder's lock): stop that service, or give this one another port or "
                "`[redis] data_dir`."
            )
        self._lock_fd = fd

    @property
    def url(self) -> str:
        """The URL clients use (it holds the password: never log it, see `config.mask_url`)."""
        return f"redis://:{urllib.parse.quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    def executable(self) -> str:
        """The redis-server binary (ConfigError with the install command when missing)."""
        executable = shutil.which(self.config.executable)
        if executable is None:
            raise ConfigError(
                f"`{self.config.executable}` is not on PATH, and the config gives no redis_url: install Redis "
                "(`apt-get install -y redis-server`), set `redis.executable` to the binary, or point `redis_url` "
                "at a running Redis."
            )
        return executable

    def conf(self) -> str:
        """The redis.conf text handed to redis-server on stdin."""
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            "protected-mode yes",
            f"requirepass {_quote(self.password)}",
            'save ""',
            f"appendonly {'yes' if self.config.persistence else 'no'}",
            f"appendfsync {self.config.fsync}",
            f"dir {_quote(str(self.data_dir))}",
            f"logfile {_quote(str(self.data_dir / 'redis.log'))}",
            "daemonize no",
        ]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        """Start redis-server and wait until it answers PING (RuntimeError with its log otherwise). The child
        inherits the folder's lock, so the folder stays locked until it has exited, even after a kill -9 of the
        service."""
        self.claim_folder()
        assert self._lock_fd is not None
        self.process = subprocess.Popen(
            [self.executable(), "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # its log goes to redis.log (`log_tail`)
            preexec_fn=die_with_parent(),
            pass_fds=(self._lock_fd,),
        )
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write(self.conf().encode())
            self.process.stdin.close()
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=1)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if client.ping():
                    log.info("embedded redis-server on 127.0.0.1:%d, password required (data in %s)", self.port,
                             self.data_dir)  # fmt: skip
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
        """Stop redis-server (SIGTERM: it writes the append-only file), then remove a temporary data dir and let
        go of the folder's lock (`remove`; a persistent folder stays, with the queue)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not remove:
            return
        if self._own_dir:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.data_dir)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
