"""Helpers of the reward service tests: a real `sanarl-reward` process on 127.0.0.1, HTTP calls, request bodies.

No mocks: the service runs as the CLI does (`python -m reward_service.cli --config ...`) with its real
redis-server, uvicorn and worker processes. If redis-server is missing the tests fail (never skip) and say how to
install it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reward_service.wire_format import encode_body

TOKEN = "test-token-0123456789"
HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "plugin_rewards.py"
REDIS_MISSING = (
    "redis-server is not on PATH: the reward service tests need a real Redis. Install it with "
    "`apt-get update && apt-get install -y redis-server` (CI installs it)."
)


def require_redis() -> str:
    """The redis-server path, or fail the test run (not skip) with the install command."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail(REDIS_MISSING, pytrace=False)
    return path


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: every socket stays bound until all are chosen, so the kernel cannot
    hand the same port out twice (picking them one by one did, once: redis and uvicorn then raced for it)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def body(
    images: np.ndarray, rewards: dict[str, float], prompts: list[str] | None = None, **extra: Any
) -> bytes:
    """An enqueue body for uint8 images `[B, H, W, 3]` (prompts default to "p0", "p1", ...)."""
    header = {"prompts": prompts or [f"p{i}" for i in range(len(images))], "reward_fn": rewards, **extra}
    header.setdefault("media_type", "image")
    return encode_body(header, images)


def images(count: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """Random uint8 images `[count, size, size, 3]`."""
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30.0):
    """(status, parsed JSON or {}) of one request; POST when `data` is given."""
    request = urllib.request.Request(
        url, data=data, headers=headers or {}, method="POST" if data is not None else "GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    try:
        return status, json.loads(text) if text else {}
    except json.JSONDecodeError:
        return status, {"raw": text.decode("utf-8", "replace")}


class Service:
    """One `sanarl-reward` process with the config `toml` written to `directory/<name>.toml`."""

    def __init__(self, directory: Path, name: str, toml: str, port: int) -> None:
        self.config = directory / f"{name}.toml"
        self.config.write_text(toml)
        self.log = directory / f"{name}.log"
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> Service:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("REMOTE_REWARD_TOKEN", None)  # the token comes from the config file
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reward_service.cli", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(HERE.parent.parent),
            )
        return self

    def log_tail(self, lines: int = 30) -> str:
        return (
            "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""
        )

    def wait_healthy(self, timeout: float = 120.0) -> dict[str, Any]:
        """Poll /health until 200; fail with the service log when it dies or times out."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"the service exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                status, answer = http(f"{self.url}/health", timeout=5)
                last = (status, answer)
                if status == 200:
                    return answer
            except OSError:
                pass
            time.sleep(0.3)
        pytest.fail(f"the service was not healthy within {timeout} s (last {last}):\n{self.log_tail()}")

    def auth(self, token: str = TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def enqueue(self, data: bytes, token: str = TOKEN) -> tuple[int, dict]:
        return http(f"{self.url}/api/reward/enqueue", data, self.auth(token))

    def pull(self, uuid: str, reward: str, wait: float = 0.0, token: str = TOKEN) -> tuple[int, dict]:
        form = urllib.parse.urlencode({"uuid": uuid, "type": reward, "wait": str(wait)}).encode()
        return http(f"{self.url}/api/reward/pull", form, self.auth(token), timeout=wait + 30)

    def result(self, uuid: str, reward: str, timeout: float = 60.0) -> tuple[int, dict]:
        """Pull until the answer is not pending (done, failed, unknown) or `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            status, answer = self.pull(uuid, reward, wait=min(5.0, max(deadline - time.monotonic(), 0.0)))
            if answer.get("status") != "pending" or time.monotonic() > deadline:
                return status, answer

    def health(self, token: str | None = TOKEN) -> tuple[int, dict]:
        return http(f"{self.url}/health", headers=self.auth(token) if token else {})

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
