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
import torch

from reward_service.wire_format import encode_body
from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards import RewardFunction
from sanarl.rewards.remote import RemoteRewardFunction
from sanarl.rewards.scorers.jpeg import JpegCompressibility, JpegIncompressibility
from sanarl.worlds import shapes as world

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


UNLOADABLE_PLUGIN = """
from sanarl.errors import ConfigError
from sanarl.rewards.base import Reward
from sanarl.rewards.registry import register


@register("unloadable")
class Unloadable(Reward):
    name = "unloadable"
    keys = ("score",)
    default_key = "score"

    def setup(self, device):
        raise ConfigError("the unloadable test reward cannot load its model (weights missing)")

    def _score(self, images, prompts, metadata):
        raise AssertionError("never scored")
"""
"""A plugin whose reward cannot load its model: a service hosting it must stop at start, naming it."""


def children(pid: int) -> dict[int, str]:
    """{pid: command name} of the live (not zombie) child processes of `pid`, read from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(stat.parent.name)] = name
    return found


def as_float(array: np.ndarray) -> torch.Tensor:
    """uint8 images `[B, H, W, 3]` as the float `[B, 3, H, W]` in [0, 1] a trainer would score."""
    return torch.from_numpy(array).permute(0, 3, 1, 2).float() / 255.0


def enqueue_ok(service: Service, data: bytes) -> str:
    status, answer = service.enqueue(data)
    assert status == 200, answer
    return answer["uuid"]


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def assert_jpeg_scores_equal_in_process(service: Service) -> None:
    """24 images of 64x64 scored by both jpeg rewards through `service` equal in-process scores exactly."""
    pixels = images(24, 64, seed=1)
    uuid = enqueue_ok(service, body(pixels, {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.5}))
    compress = JpegCompressibility().score(as_float(pixels), ["p"] * 24)
    incompress = JpegIncompressibility().score(as_float(pixels), ["p"] * 24)
    status, answer = service.result(uuid, "jpeg_compressibility")
    assert status == 200, answer
    assert answer["scores"]["jpeg_compressibility"] == compress["jpeg_compressibility"].tolist()
    assert answer["scores"]["jpeg_kb"] == compress["jpeg_kb"].tolist()
    info = answer["input_info"]
    assert info["shape"] == [24, 64, 64, 3]
    assert (info["min"], info["max"]) == (int(pixels.min()), int(pixels.max()))
    assert answer["type"] == "jpeg_compressibility" and answer["attempts"] == 1 and answer["duration"] > 0
    status, answer = service.result(uuid, "jpeg_incompressibility")
    assert status == 200
    assert answer["scores"]["jpeg_incompressibility"] == incompress["jpeg_incompressibility"].tolist()


def assert_remote_equals_in_process(enqueue_to: Service, pull_from: Service) -> None:
    """`RemoteRewardFunction` (enqueue to one service, pull from another or the same) equals `RewardFunction`
    in-process on a mixed config (weights, clips, a score key, scale) with one diverged (NaN) sample."""
    rows = [world.list_prompts("train")["two_object"][0]] * 4
    pixels = np.stack([world.render(row, 32, seed=i) for i, row in enumerate(rows)])
    x = as_float(pixels)
    x[2] = float("nan")  # a diverged sample: dropped by both
    prompts = [row["prompt"] for row in rows]
    config = RemoteRewardConfig(
        reward_fns=[
            RewardFnConfig(name="jpeg_incompressibility", weight=0.5, clip_max=1.0),
            RewardFnConfig(name="shapes", weight=2.0, score_key="strict"),
        ],
        scale=1.5,
        reward_clip_min=-1.0,
    )
    local = RewardFunction(config)(x, prompts, rows)
    fn = RemoteRewardFunction(
        config,
        enqueue_url=f"{enqueue_to.url}/api/reward/enqueue",
        fetch_url=f"{pull_from.url}/api/reward/pull",
        token=TOKEN,
    )
    task = fn.submit(x, prompts, rows)  # returns at once; the service scores meanwhile
    got = task.result()
    assert got.nan_mask.tolist() == local.nan_mask.tolist() == [False, False, True, False]
    keep = ~local.nan_mask
    assert torch.equal(got.total[keep], local.total[keep])
    assert sorted(got.per_key) == sorted(local.per_key)
    for key, value in local.per_key.items():
        assert torch.equal(got.per_key[key][keep], value[keep]), key


def assert_enqueue_refusals(service: Service, cases: dict[str, tuple[bytes, int, str]], good: bytes) -> None:
    """Each body of `cases` ({name: (body, status, fragment of the error)}) gets its status and a message with the
    fragment; the good body with a wrong token or none gets 401."""
    for name, (data, status, fragment) in cases.items():
        got, answer = service.enqueue(data)
        assert (got, fragment in answer.get("error", "")) == (status, True), (name, answer)
    assert service.enqueue(good, token="wrong-token-0123456789")[0] == 401
    status, answer = http(f"{service.url}/api/reward/enqueue", good, {})
    assert status == 401 and "bearer token" in answer["error"]
