"""Starting the reward service the way a user does: the `sanarl-reward` script as a subprocess, from a directory
that has nothing to do with sanarl, with the token in the environment.

- the documented quick start (`sanarl-reward --config rewards`) serves: /health 200, a score comes back;
- a service whose workers cannot start stops with a non-zero exit and a message naming the config and the fix;
- enqueue of a reward that no live worker hosts is refused (503 naming the reward), never queued forever.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import torch
from service_helpers import TOKEN, UNLOADABLE_PLUGIN, body, children, free_port, http, images, require_redis

from sanarl.rewards.scorers.jpeg import JpegCompressibility

pytestmark = [pytest.mark.service, pytest.mark.slow]


def sanarl_reward() -> list[str]:
    """The installed `sanarl-reward` script (what users type); `python -m reward_service.cli` without one."""
    script = shutil.which("sanarl-reward")
    return [script] if script else [sys.executable, "-m", "reward_service.cli"]


def environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "REMOTE_REWARD_TOKEN": TOKEN}
    repo = str(Path(__file__).resolve().parents[2])  # this checkout, whatever the cwd
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return {**env, **extra}


def launch(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            sanarl_reward() + args,
            cwd=cwd,
            env=environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_api(process: subprocess.Popen, url: str, log: Path, want: int | None, timeout: float = 120.0):
    """Poll /health until it answers (with status `want`, when given); fail with the log if the service exits."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"the service exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            last = http(f"{url}/health", timeout=5)
            if want is None or last[0] == want:
                return last
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"/health never answered {want} within {timeout} s (last {last}):\n{log.read_text()[-3000:]}")


def test_quick_start_serves_from_an_unrelated_directory(tmp_path):
    """`sanarl-reward --config rewards` (the shipped config) with cwd = an empty temp directory: both workers
    find the shipped file too, /health turns 200 and a jpeg score equal to the in-process one comes back."""
    require_redis()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "service.log"
    process = launch(["--config", "rewards", "--port", str(port)], tmp_path, log)
    try:
        status, health = wait_for_api(process, url, log, want=200)
        assert health["status"] == "ok" and health["rewards"]["jpeg_compressibility"]["workers"] >= 1
        pixels = images(2, 16, seed=3)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        status, answer = http(
            f"{url}/api/reward/enqueue", body(pixels, {"jpeg_compressibility": 1.0}), headers
        )
        assert status == 200, answer
        form = f"uuid={answer['uuid']}&type=jpeg_compressibility&wait=20".encode()
        status, result = http(f"{url}/api/reward/pull", form, headers, timeout=60)
        assert status == 200, result
        expected = JpegCompressibility().score(
            torch.from_numpy(pixels).permute(0, 3, 1, 2) / 255.0, ["p0", "p1"]
        )
        assert result["scores"]["jpeg_compressibility"] == expected["jpeg_compressibility"].tolist()
    finally:
        stop(process)
    assert "cannot read the reward service config" not in log.read_text()


def test_workers_that_cannot_start_stop_the_service_with_the_reason(tmp_path):
    """The API builds rewards without loading them; a worker whose reward cannot load exits with code 2, and the
    service then exits 2 too, naming the config and what to fix, instead of serving a /health 503 forever."""
    require_redis()
    (tmp_path / "unloadable.py").write_text(UNLOADABLE_PLUGIN)
    config = tmp_path / "broken.toml"
    config.write_text(
        f'port = {free_port()}\nplugins = ["{tmp_path / "unloadable.py"}"]\n[workers]\ncount = 1\n'
        '[[reward_args]]\nreward_type = "unloadable"\n'
    )
    run = subprocess.run(
        sanarl_reward() + ["--config", "broken.toml"],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]  # the service's message carries the worker's own error
    assert (
        last.startswith("sanarl-reward: error: reward worker pid") and "could not build its rewards" in last
    )
    assert "the unloadable test reward cannot load its model (weights missing)" in last
    assert str(config) in last and "start sanarl-reward again" in last


def test_enqueue_of_a_reward_without_a_live_worker_is_refused(tmp_path):
    """An API-only instance (workers.count = 0, no other instance on its Redis): enqueue answers 503 naming the
    reward instead of a uuid whose result would stay pending forever; nothing is queued."""
    require_redis()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "api-only.toml"
    config.write_text(
        f'port = {port}\n[workers]\ncount = 0\n[[reward_args]]\nreward_type = "jpeg_compressibility"\n'
    )
    log = tmp_path / "service.log"
    process = launch(["--config", str(config)], tmp_path, log)
    try:
        status, health = wait_for_api(process, url, log, want=503)
        assert health["no_worker"] == ["jpeg_compressibility"]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        status, answer = http(
            f"{url}/api/reward/enqueue", body(images(1, 8), {"jpeg_compressibility": 1.0}), headers
        )
        assert status == 503, answer
        assert answer["no_worker"] == ["jpeg_compressibility"] and "no live worker" in answer["error"]
        assert http(f"{url}/health", headers=headers)[1]["pending"] == 0
    finally:
        stop(process)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def listening_port(pid: int) -> int:
    """The TCP port process `pid` listens on (its socket inodes matched against /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            return int(fields[1].split(":")[1], 16)
    raise AssertionError(f"process {pid} listens on no TCP port")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux-only")
def test_kill_9_of_the_service_leaves_no_redis_server_and_its_folder_goes_at_the_next_start(tmp_path):
    """The embedded redis-server requires a (random) password and dies with the service: after kill -9 of the
    API process its redis-server and workers are gone within seconds; without persistence its data folder is
    temporary, and the one a killed service could not remove is removed when the next service starts."""
    require_redis()
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    first = tmp_path / "first.toml"
    first.write_text(
        f"port = {port}\n[redis]\npersistence = false\n[workers]\ncount = 2\n"
        '[[reward_args]]\nreward_type = "jpeg_compressibility"\n'
    )
    log = tmp_path / "service.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            sanarl_reward() + ["--config", str(first)],
            cwd=tmp_path, env=environment(TMPDIR=str(temp)), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_api(process, f"http://127.0.0.1:{port}", log, want=None)  # workers may still be importing
        kids = children(process.pid)
        assert len(kids) == 3, kids  # redis-server and the shipped config's 2 workers
        (redis_pid,) = [pid for pid, name in kids.items() if name.startswith("redis")]
        stranger = redis.Redis(port=listening_port(redis_pid), socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            stranger.keys("*")
        for pid in kids:  # nothing secret on a command line
            assert b"redis://" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        (folder,) = temp.glob(f"sanarl-redis-{process.pid}-*")
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        process.kill()
        process.wait()
        deadline = time.monotonic() + 10
        while not all(gone(pid) for pid in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in kids if not gone(pid)] == [], kids
        assert folder.exists()  # a killed service cannot clean up; the next one does
    finally:
        stop(process)
    config, next_port = tmp_path / "next.toml", free_port()
    config.write_text(
        f"port = {next_port}\n[redis]\npersistence = false\n[workers]\ncount = 0\n"
        '[[reward_args]]\nreward_type = "shapes"\n'
    )
    log2 = tmp_path / "next.log"
    with log2.open("wb") as out:
        second = subprocess.Popen(
            sanarl_reward() + ["--config", str(config)],
            cwd=tmp_path, env=environment(TMPDIR=str(temp)), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_api(second, f"http://127.0.0.1:{next_port}", log2, want=503)
        assert not folder.exists() and len(list(temp.glob("sanarl-redis-*"))) == 1  # only the new one's
    finally:
        stop(second)


def test_secrets_stay_out_of_logs_health_and_the_schema(tmp_path):
    """An external redis_url's password is masked in the start-up log; /health without the token does not name
    the Redis (its error text holds the address) - with the token it does; /openapi.json and /docs do not exist."""
    require_redis()
    redis_port, port = free_port(), free_port()
    password = "external-redis-password-42"
    server = subprocess.Popen(
        ["redis-server", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=tmp_path
    )
    assert server.stdin is not None
    server.stdin.write(f'port {redis_port}\nbind 127.0.0.1\nrequirepass {password}\nsave ""\n'.encode())
    server.stdin.close()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "external.toml"
    config.write_text(
        f'port = {port}\nredis_url = "redis://:{password}@127.0.0.1:{redis_port}/0"\nlog_level = "info"\n'
        '[workers]\ncount = 0\n[[reward_args]]\nreward_type = "shapes"\n'
    )
    log = tmp_path / "service.log"
    client = redis.Redis(port=redis_port, password=password, socket_connect_timeout=1)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            assert time.monotonic() < deadline, "the test's redis-server did not start"
            time.sleep(0.1)
    process = launch(["--config", str(config)], tmp_path, log)
    try:
        wait_for_api(process, url, log, want=503)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert http(url + path)[0] == 404 and http(url + path, headers=headers)[0] == 404
        server.terminate()
        server.wait(timeout=10)
        status, public = http(f"{url}/health")
        assert status == 503 and public == {"status": "unavailable", "redis": {"ok": False}}
        status, private = http(f"{url}/health", headers=headers)
        assert status == 503 and str(redis_port) in private["redis"]["error"]
    finally:
        stop(process)
        if server.poll() is None:
            server.kill()
    text = log.read_text()
    assert "redis://:***@127.0.0.1" in text and password not in text
