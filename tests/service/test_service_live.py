"""The reward service end to end: real redis-server, `sanarl-reward` under uvicorn on 127.0.0.1, real worker
processes (jpeg, shapes and the test plugin's `slow_mean`), the trainer-side client. No mocks.

Two instances share one Redis: `a` (embedded redis-server with persistence, 2 workers) and `b` (API only, 0 workers,
a 1.5 s task deadline) - any instance answers any pull. Oracles: in-process reward calls on the same pixels, and
hand-computed pixel means. Destructive tests (load, kill -9, Redis restart, shutdown) run last, in file order.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from service_helpers import (
    PLUGIN,
    TOKEN,
    Service,
    as_float,
    assert_enqueue_refusals,
    assert_jpeg_scores_equal_in_process,
    assert_remote_equals_in_process,
    body,
    enqueue_ok,
    free_ports,
    http,
    images,
    require_redis,
    wait_for,
)

from reward_service.broker import AsyncBroker, QueueFull
from reward_service.config import LimitsConfig, WorkersConfig, loads_service_config
from reward_service.keys import Keys, queue_item
from reward_service.lua import Scripts
from reward_service.signing import BodyDigests, open_result, result_key
from reward_service.wire_format import parse_enqueue
from reward_service.worker import reap_dead_workers
from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.errors import ConfigError
from sanarl.rewards.pool import RewardTimeout
from sanarl.rewards.remote import RemoteRewardError, RemoteRewardFunction
from sanarl.rewards.scorers.jpeg import JpegCompressibility
from sanarl.rewards.scorers.shapes import ShapesReward
from sanarl.worlds import shapes as world

pytestmark = pytest.mark.service
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "sanarl-hypothesis")  # not .hypothesis/ in the repo

PREFIX = "sanarl:reward:"
REDIS_PASSWORD = "live-test-redis-password-0123"
"""Instance a's embedded redis-server requires it (set in the config, so that b and the tests can share it)."""
REWARDS = ("jpeg_compressibility", "jpeg_incompressibility", "shapes", "slow_mean")


def config_text(port: int, workers: int, deadline: float, redis_port: int, embedded_dir: str = "") -> str:
    """Instance config: embedded redis-server on `redis_port` when `embedded_dir` is set, else that Redis."""
    entries = "".join(f'[[reward_args]]\nreward_type = "{name}"\n' for name in REWARDS)
    url = "" if embedded_dir else f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_port}/0"
    return f"""
port = {port}
token = "{TOKEN}"
plugins = ["{PLUGIN}"]
log_level = "warning"
redis_url = "{url}"
[redis]
port = {redis_port}
persistence = true
data_dir = "{embedded_dir}"
password = "{REDIS_PASSWORD}"
[limits]
max_payload_bytes = 2000000
max_images = 64
max_pending_tasks = 24
result_ttl_s = 300
task_deadline_s = {deadline}
max_pull_wait_s = 10
[workers]
count = {workers}
batch_images = 64
visibility_timeout_s = 2.0
torch_threads = 1
{entries}"""


def wait_for_redis(client: redis.Redis, owner: Service, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.ping():
                return
        except redis.RedisError:
            if time.monotonic() > deadline or owner.process.poll() is not None:
                pytest.fail(f"the embedded redis-server never came up:\n{owner.log_tail()}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    """Instance `a` (embedded Redis, 2 workers) and instance `b` (API only) on one Redis; stopped at the end."""
    require_redis()
    tmp = tmp_path_factory.mktemp("reward-service")
    redis_port, a_port, b_port = free_ports(3)
    a = Service(tmp, "a", config_text(a_port, 2, 60.0, redis_port, str(tmp / "redis-a")), a_port).start()
    b = Service(tmp, "b", config_text(b_port, 0, 1.5, redis_port), b_port)
    client = redis.Redis(port=redis_port, password=REDIS_PASSWORD, socket_timeout=10)
    try:
        wait_for_redis(client, a)  # b checks its redis_url at start
        b.start()
        a.wait_healthy()
        b.wait_healthy()
        yield SimpleNamespace(a=a, b=b, redis=client, redis_port=redis_port, tmp=tmp)
    finally:
        b.stop()
        a.stop()


def pending(svc) -> int:
    return int(svc.redis.get(PREFIX + "pending") or 0)


def stored_pixels(svc) -> int:
    """Requests whose pixels Redis holds."""
    return sum(1 for _ in svc.redis.scan_iter(match=PREFIX + "blob:*"))


def busy_workers(svc) -> int:
    """Workers holding at least one task."""
    return sum(1 for k in svc.redis.scan_iter(match=PREFIX + "proc:*") if svc.redis.llen(k))


def occupy_both_workers(svc, sleep: float) -> list[str]:
    """One slow task per worker: the second is enqueued once the first is held, so they cannot share a batch."""
    uuids = []
    for busy in (1, 2):
        uuids.append(enqueue_ok(svc.a, body(images(1, 8), {"slow_mean": 1.0}, metadata={"sleep": sleep})))
        wait_for(lambda busy=busy: busy_workers(svc) == busy, what=f"{busy} busy worker(s)")
    return uuids


# ------------------------------------------------------------------------------------------------ answers


def test_health_lists_rewards_and_shows_workers_only_with_the_token(svc):
    status, public = svc.a.health(token=None)
    assert status == 200 and public["status"] == "ok" and "workers" not in public
    jpeg = public["rewards"]["jpeg_compressibility"]
    assert (
        jpeg["keys"] == ["jpeg_compressibility", "jpeg_kb"] and jpeg["default_key"] == "jpeg_compressibility"
    )
    assert jpeg["workers"] == 2 and public["rewards"]["slow_mean"]["default_key"] == "mean"
    status, full = svc.a.health()
    assert [w["alive"] for w in full["workers"]] == [True, True]
    assert all(w["rewards"] == sorted(REWARDS) for w in full["workers"])
    status, via_b = svc.b.health(token=None)
    assert status == 200 and via_b["rewards"]["shapes"]["workers"] == 2  # b has no workers of its own


def test_jpeg_scores_equal_in_process_scores(svc):
    assert_jpeg_scores_equal_in_process(svc.a)


def test_shapes_gets_per_image_and_cosmos_rl_top_level_metadata(svc):
    rows = [
        world.list_prompts("train")[tag][0] for tag in ("single_object", "two_object", "counting", "colors")
    ]
    pixels = np.stack([world.render(row, 32, seed=i) for i, row in enumerate(rows)])
    prompts = [row["prompt"] for row in rows]
    uuid = enqueue_ok(svc.a, body(pixels, {"shapes": 1.0}, prompts, metadata=rows))
    expected = ShapesReward().score(as_float(pixels), prompts, rows)
    status, answer = svc.a.result(uuid, "shapes")
    assert status == 200 and answer["scores"] == {k: v.tolist() for k, v in expected.items()}
    assert answer["scores"]["strict"] == [1.0, 1.0, 1.0, 1.0]  # rendered ground truth satisfies its row
    # Cosmos-RL's GenEval request: one `prompt`, the row's fields at the top level
    row = rows[1]
    geneval = body(
        pixels[1:2], {"shapes": 1.0}, None, prompt=row["prompt"], tag=row["tag"], include=row["include"]
    )
    uuid = enqueue_ok(svc.a, geneval.replace(b'"prompts":["p0"],', b"", 1))
    status, answer = svc.a.result(uuid, "shapes")
    assert status == 200 and answer["scores"]["partial"] == expected["partial"][1:2].tolist()


def test_video_is_scored_as_the_mean_of_its_frames(svc):
    video = np.random.default_rng(5).integers(0, 256, (2, 3, 4, 8, 8), dtype=np.uint8)
    uuid = enqueue_ok(svc.a, body(video, {"slow_mean": 1.0}, media_type="video"))
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 200
    assert answer["scores"]["mean"] == pytest.approx(video.reshape(2, -1).mean(axis=1) / 255.0, abs=1e-6)
    assert answer["input_info"]["shape"] == [2, 3, 4, 8, 8] and answer["batch"]["images"] == 8


def test_pull_tells_pending_unknown_and_failed_apart(svc):
    pixels = images(2, 8, seed=2)
    uuid = enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0}, metadata={"sleep": 1.0}))
    status, answer = svc.a.pull(uuid, "slow_mean")
    assert status == 400 and answer["status"] == "pending" and answer["uuid"] == uuid
    status, answer = svc.a.pull("0123-no-such-task", "slow_mean")
    assert status == 404 and answer["status"] == "unknown" and "unknown or expired" in answer["error"]
    status, answer = svc.a.pull(uuid, "shapes")
    assert status == 404 and "['slow_mean'], not 'shapes'" in answer["error"]
    status, answer = http(f"{svc.a.url}/api/reward/pull", b"type=slow_mean", svc.a.auth())
    assert status == 422 and "uuid" in answer["error"]
    bad = enqueue_ok(svc.a, body(pixels, {"shapes": 1.0}))  # shapes needs metadata: the reward refuses
    status, answer = svc.a.result(bad, "shapes")
    assert status == 500 and answer["status"] == "failed" and "reward 'shapes' failed" in answer["error"]
    assert "metadata" in answer["error"]
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 200 and answer["scores"]["mean"] == pytest.approx(
        pixels.reshape(2, -1).mean(1) / 255, abs=1e-6
    )


def raw_request(port: int, head: bytes, payload: bytes = b"", close_early: bool = False) -> bytes:
    """Send raw bytes; returns the status line (or b"" when the connection was closed on purpose). The server
    may answer and close before the payload is sent (413): the send error is ignored, the answer read."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(head + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if close_early:
            return b""
        return sock.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.parametrize("value", [b"abc", b"-1", b"10, 10", b"", b"99999999999999999999999"])
def test_a_malformed_content_length_gets_a_400_naming_the_header(svc, value):
    """The HTTP parser refuses such a head before the app sees it; the service's protocol still answers JSON
    naming Content-Length and the fix (not uvicorn's generic "Invalid HTTP request received."), then serves on."""
    head = (
        b"POST /api/reward/enqueue HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode()
        + b"\r\nContent-Length: " + value + b"\r\n\r\n"
    )  # fmt: skip
    answer = b""
    with socket.create_connection(("127.0.0.1", svc.a.port), timeout=10) as sock:
        sock.sendall(head + b"{}")
        while chunk := sock.recv(4096):  # the server closes after its answer
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, payload = rest.partition(b"\r\n\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request" and b"content-type: application/json" in headers
    error = json.loads(payload)
    assert error["status"] == "error" and "Content-Length" in error["error"], error
    assert "decimal byte count" in error["error"] and "nothing was read or queued" in error["error"]
    assert svc.a.health()[0] == 200


def test_bad_input_gets_the_right_4xx_and_the_service_keeps_serving(svc):
    good = body(images(2, 8), {"jpeg_compressibility": 1.0})
    header, npy_bytes = good.split(b"\n", 1)
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    cases = {
        "truncated": (good[:-7], 422, "truncated"),
        "no newline": (header, 422, "no newline"),
        "pickled npy": (header + b"\n" + buffer.getvalue(), 422, "pickle"),
        "float32": (
            body(images(2, 8).astype(np.float32), {"jpeg_compressibility": 1.0}),
            422,
            "dtype float32",
        ),
        "ndim": (body(images(2, 8)[:, :, :, 0], {"jpeg_compressibility": 1.0}), 422, "[B, H, W, 3]"),
        "0 images": (body(images(0, 8), {"jpeg_compressibility": 1.0}, []), 422, "0 images"),
        "prompt count": (body(images(2, 8), {"jpeg_compressibility": 1.0}, ["only one"]), 422, "1 entries"),
        "unknown reward": (body(images(2, 8), {"pickscore": 1.0}), 422, "unknown reward"),
        "too many images": (body(images(65, 1), {"jpeg_compressibility": 1.0}), 413, "max_images"),
    }
    before = pending(svc)
    assert_enqueue_refusals(svc.a, cases, good)
    assert http(f"{svc.a.url}/api/reward/ping", b"info_data=x", svc.a.auth())[1] == {
        "message": "Ping request received"
    }
    assert http(f"{svc.a.url}/api/reward/ping", b"info_data=x", {})[0] == 401
    huge = (
        b"POST /api/reward/enqueue HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
        b"Content-Length: 1000000000000\r\n\r\n"
    )
    assert raw_request(svc.a.port, huge, b"{") == b"HTTP/1.1 413 Request Entity Too Large"
    chunked = huge.replace(b"Content-Length: 1000000000000", b"Transfer-Encoding: chunked")
    big = body(images(2, 600), {"jpeg_compressibility": 1.0})  # 2.2 MB, no declared size: counted while read
    payload = b"".join(
        b"%x\r\n%s\r\n" % (len(c), c) for c in (big[i : i + 65536] for i in range(0, len(big), 65536))
    )
    assert (
        raw_request(svc.a.port, chunked, payload + b"0\r\n\r\n") == b"HTTP/1.1 413 Request Entity Too Large"
    )
    assert pending(svc) == before
    uuid = enqueue_ok(svc.a, good)
    assert svc.a.result(uuid, "jpeg_compressibility")[0] == 200


def test_client_disconnect_mid_upload_queues_nothing(svc):
    before = pending(svc)
    head = (
        b"POST /api/reward/enqueue HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
        b"Content-Length: 500000\r\n\r\n"
    )
    for _ in range(3):
        raw_request(
            svc.a.port, head, body(images(4, 32), {"jpeg_compressibility": 1.0})[:20000], close_early=True
        )
    time.sleep(0.3)
    assert pending(svc) == before and svc.a.health()[0] == 200
    uuid = enqueue_ok(svc.a, body(images(1, 8), {"jpeg_compressibility": 1.0}))
    assert svc.a.result(uuid, "jpeg_compressibility")[0] == 200


def test_enqueue_is_idempotent_by_request_id(svc):
    data = body(images(2, 8, seed=3), {"slow_mean": 1.0}, metadata={"sleep": 0.5}, request_id="trainer-42")
    before, blobs = pending(svc), stored_pixels(svc)
    first, second = enqueue_ok(svc.a, data), enqueue_ok(svc.b, data)  # a retry may reach another instance
    assert first == second and pending(svc) == before + 1
    status, answer = svc.a.enqueue(body(images(2, 8, seed=4), {"slow_mean": 1.0}, request_id="trainer-42"))
    assert status == 409 and answer["uuid"] == first
    same_pixels = body(
        images(2, 8, seed=3), {"slow_mean": 1.0}, metadata={"sleep": 0.4}, request_id="trainer-42"
    )
    status, answer = svc.a.enqueue(same_pixels)  # other prompts / metadata under the same id: also a conflict
    assert status == 409 and answer["uuid"] == first
    assert stored_pixels(svc) == blobs + 1  # a repeated or refused request leaves no pixels behind
    status, answer = svc.a.result(first, "slow_mean")
    assert status == 200 and answer["attempts"] == 1


def test_tasks_of_one_reward_are_batched_across_requests(svc):
    blockers = occupy_both_workers(svc, sleep=1.5)
    batches = [images(3, 8, seed=10 + i) for i in range(6)]
    uuids = [enqueue_ok(svc.a, body(p, {"slow_mean": 1.0})) for p in batches]
    answers = [svc.a.result(u, "slow_mean")[1] for u in uuids]
    for pixels, answer in zip(batches, answers, strict=True):
        assert answer["scores"]["mean"] == pytest.approx(pixels.reshape(3, -1).mean(1) / 255, abs=1e-6)
    assert max(a["batch"]["tasks"] for a in answers) >= 2  # queued requests shared a scoring call
    assert all(a["batch"]["images"] <= 64 for a in answers)
    assert len({a["scores"]["pid"][0] for a in answers}) <= 2
    for uuid in blockers:
        assert svc.a.result(uuid, "slow_mean")[0] == 200


def remote(svc, names, service=None, **kwargs) -> RemoteRewardFunction:
    service = service or svc.a
    fns = [RewardFnConfig(name=n) if isinstance(n, str) else n for n in names]
    return RemoteRewardFunction(
        RemoteRewardConfig(reward_fns=fns),
        enqueue_url=f"{service.url}/api/reward/enqueue",
        fetch_url=f"{service.url}/api/reward/pull",
        token=kwargs.pop("token", TOKEN),
        **kwargs,
    )


def test_queue_full_answers_429_and_the_client_backs_off(svc):
    occupy_both_workers(svc, sleep=3.0)
    accepted, status = [], 200
    while status == 200 and len(accepted) < 40:
        blobs = stored_pixels(svc)
        status, answer = svc.a.enqueue(body(images(1, 8), {"slow_mean": 1.0}))
        if status == 200:
            accepted.append(answer["uuid"])
    assert status == 429 and "max_pending_tasks = 24" in answer["error"]
    assert stored_pixels(svc) <= blobs  # the refused request's pixels were dropped again
    assert len(accepted) == 22 and pending(svc) == 24
    fn = remote(svc, ["slow_mean"], backoff_s=0.2, retries=12)
    pixels = images(2, 8, seed=6)
    result = fn(as_float(pixels), ["a", "b"])  # retried on 429 until the queue drained
    assert result.total.tolist() == pytest.approx(pixels.reshape(2, -1).mean(1) / 255, abs=1e-6)
    assert all(svc.a.result(u, "slow_mean")[0] == 200 for u in accepted)
    wait_for(lambda: pending(svc) == 0, what="queue drained")


def test_remote_reward_function_equals_in_process_reward_function(svc):
    assert_remote_equals_in_process(svc.a, svc.b)  # any instance answers the pull


def test_remote_client_errors_are_clear(svc, monkeypatch):
    with pytest.raises(ConfigError, match=r"does not serve.*\['pickscore'\]|\['pickscore'\].*does not serve"):
        remote(svc, ["pickscore"])
    with pytest.raises(ConfigError, match="refused the token"):
        remote(svc, ["jpeg_compressibility"], token="wrong", check=False)(torch.zeros(1, 3, 8, 8), ["p"])
    for name in ("REMOTE_REWARD_TOKEN", "REMOTE_REWARD_ENQUEUE_URL", "REMOTE_REWARD_FETCH_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="REMOTE_REWARD_ENQUEUE_URL is not set"):
        RemoteRewardFunction(RemoteRewardConfig(reward_fns=[RewardFnConfig(name="shapes")]))
    with pytest.raises(
        RemoteRewardError, match=r"task [0-9a-f-]{36} \(shapes\) failed: reward 'shapes' failed"
    ):
        remote(svc, ["shapes"])(torch.zeros(2, 3, 8, 8), ["p", "q"])  # no metadata: the reward refuses
    slow = remote(svc, ["slow_mean"], deadline_s=0.5)
    with pytest.raises(RewardTimeout, match=r"task [0-9a-f-]{36} \(slow_mean\).*rollout.reward_deadline_s"):
        slow(torch.zeros(1, 3, 8, 8), ["p"], [{"sleep": 2.0}])


def test_any_instance_answers_and_a_task_past_its_deadline_fails(svc):
    pixels = images(3, 16, seed=7)
    uuid = enqueue_ok(svc.a, body(pixels, {"jpeg_compressibility": 1.0}))
    status_b, via_b = svc.b.result(uuid, "jpeg_compressibility")
    assert status_b == 200 and via_b == svc.a.result(uuid, "jpeg_compressibility")[1]
    slow = enqueue_ok(svc.b, body(pixels[:1], {"slow_mean": 1.0}, metadata={"sleep": 3.0}))
    status, answer = svc.b.pull(slow, "slow_mean", wait=5.0)  # b's deadline is 1.5 s
    assert status == 500 and "limits.task_deadline_s = 1.5 s" in answer["error"]
    assert svc.a.pull(slow, "slow_mean")[0] == 500  # the failure is stored, every instance sees it
    wait_for(lambda: pending(svc) == 0, what="the late worker to drop its copy")


def pull_until(service: Service, uuid: str, reward: str, status: int, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got, answer = service.pull(uuid, reward, wait=1.0)
        if got == status:
            return answer
        assert time.monotonic() < deadline, f"no {status} within {timeout} s; last {got} {answer}"
        time.sleep(0.1)


def test_a_forged_result_written_into_redis_is_never_served(svc):
    """A local process wrote `{"scores": ...999...}` under a task's result key and the API served it with 200.
    Now Redis refuses a client without the password; a writer that has it (or shares an external Redis) gets its
    unsigned value refused (502, logged; a forged pub/sub notice is ignored too), the worker that scores the task
    replaces it, and the real score is served. A forgery over a finished result is refused as well."""
    forged = json.dumps({"status": "done", "result": {"scores": {"mean": [999.0]}, "attempts": 1}})
    stranger = redis.Redis(port=svc.redis_port, socket_timeout=5)  # no password
    for command in (lambda: stranger.set(f"{PREFIX}result:x:slow_mean", forged), lambda: stranger.keys("*")):
        with pytest.raises(redis.AuthenticationError):
            command()
    pixels = images(1, 8, seed=31)
    uuid = enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0}, metadata={"sleep": 3.0}))
    key = f"{PREFIX}result:{uuid}:slow_mean"
    svc.redis.set(key, forged)  # with the password, before the worker is done
    svc.redis.publish(PREFIX + "done", f"{uuid}|slow_mean\n{forged}")
    for service in (svc.a, svc.b):
        status, answer = service.pull(uuid, "slow_mean")
        assert status == 502 and answer["status"] == "refused" and "999" not in json.dumps(answer)
        assert "fails its signature check" in answer["error"]
    real = pull_until(svc.a, uuid, "slow_mean", 200)
    assert real["scores"]["mean"] == pytest.approx([pixels.mean() / 255], abs=1e-6)
    svc.redis.set(key, "0" * 64 + "." + forged, keepttl=True)  # over the finished result, a made-up signature
    status, answer = svc.a.pull(uuid, "slow_mean", wait=1.0)
    assert status == 502 and "999" not in json.dumps(answer)
    assert "refused (not served)" in svc.a.log.read_text()
    assert (
        "was not signed by this service" in svc.a.log.read_text()
    )  # the worker's notice when it replaced it


def test_pixels_changed_in_redis_after_enqueue_never_get_a_score(svc):
    """The API signs each request's header and pixels; a writer with Redis access who swaps the pixels of a queued
    task (to make a worker sign a score of its choosing) gets the task failed: the worker checks the signature
    while it scores the batch and stores the failure, never the score."""
    blockers = occupy_both_workers(svc, sleep=2.0)
    pixels = images(1, 8, seed=32)
    uuid = enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0}))
    buffer = io.BytesIO()
    np.save(buffer, np.full_like(pixels, 255), allow_pickle=False)  # slow_mean would score it 1.0
    assert svc.redis.set(f"{PREFIX}blob:{uuid}", buffer.getvalue(), xx=True, keepttl=True)
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 500 and "fails its signature check" in answer["error"] and "scores" not in answer
    for blocker in blockers:
        assert svc.a.result(blocker, "slow_mean")[0] == 200


def assert_workers_go_on(svc, blockers: list[str], seed: int) -> None:
    """After a task failed on data changed in Redis: the tasks that held the workers were scored, and a fresh
    request is scored right."""
    for blocker in blockers:
        assert svc.a.result(blocker, "slow_mean")[0] == 200
    pixels = images(2, 8, seed=seed)
    status, answer = svc.a.result(enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0})), "slow_mean")
    assert status == 200
    assert answer["scores"]["mean"] == pytest.approx(pixels.reshape(2, -1).mean(1) / 255, abs=1e-6)


@pytest.mark.parametrize(
    "header", [b"not json", b'{"shape": [1, 8, 8, 3]}'], ids=["not-json", "no-media-type"]
)
def test_a_header_changed_in_redis_fails_its_task_and_the_workers_go_on(svc, header):
    """The worker reads a task's header before its signature is checked (the check runs beside the scoring): a
    header a Redis writer replaced with something unreadable fails that task with the signature failure and the
    workers keep scoring the next requests."""
    blockers = occupy_both_workers(svc, sleep=1.0)
    uuid = enqueue_ok(svc.a, body(images(1, 8, seed=33), {"slow_mean": 1.0}))
    assert svc.redis.hset(f"{PREFIX}task:{uuid}", "header", header) == 0  # replaced, not added
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 500 and "fails its signature check" in answer["error"] and "scores" not in answer
    assert_workers_go_on(svc, blockers, seed=34)


@pytest.mark.parametrize("created", [b"yesterday", b"nan"])
def test_a_creation_time_changed_in_redis_fails_its_task_and_the_workers_go_on(svc, created):
    """A task's `created` (Redis time, not covered by the signature) replaced with something that is no time: pulls
    keep answering pending, the worker that claims the task fails it naming the field, the workers go on."""
    blockers = occupy_both_workers(svc, sleep=1.0)
    uuid = enqueue_ok(svc.a, body(images(1, 8, seed=35), {"slow_mean": 1.0}))
    assert svc.redis.hset(f"{PREFIX}task:{uuid}", "created", created) == 0  # replaced, not added
    status, answer = svc.a.pull(uuid, "slow_mean")
    assert status == 400 and answer["status"] == "pending" and answer["age_s"] is None
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 500 and "stored task unreadable: created" in answer["error"] and "scores" not in answer
    assert_workers_go_on(svc, blockers, seed=36)


def test_scripts_redis_lost_are_loaded_again(svc):
    """SCRIPT FLUSH (a Redis that restarted without them) while a worker scores, then before an enqueue: the worker's
    finish pipeline and the API's enqueue pipeline load the scripts and send again; both requests are scored."""
    held = images(2, 8, seed=41)
    uuid = enqueue_ok(svc.a, body(held, {"slow_mean": 1.0}, metadata={"sleep": 0.6}))
    wait_for(lambda: svc.redis.llen(PREFIX + "queue:slow_mean") == 0, what="the task to be claimed")
    svc.redis.script_flush()
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 200 and answer["scores"]["mean"] == pytest.approx(
        held.reshape(2, -1).mean(1) / 255, abs=1e-6
    )
    svc.redis.script_flush()
    fresh = images(1, 8, seed=42)
    status, answer = svc.a.result(enqueue_ok(svc.a, body(fresh, {"slow_mean": 1.0})), "slow_mean")
    assert status == 200 and answer["scores"]["mean"] == pytest.approx([fresh.mean() / 255], abs=1e-6)


def test_the_enqueue_script_queues_nothing_whose_pixels_are_not_stored(svc):
    """lua.ENQUEUE runs after the SET of the pixels; when that SET did not store them, it answers 'lost' and
    writes nothing (the API then answers 503 and the client retries)."""
    keys, scripts = Keys("losttest:"), Scripts.register(svc.redis)
    header = json.dumps({"shape": [1, 1, 1, 3], "media_type": "image"})
    out = scripts.enqueue(
        keys=[keys.task("u2"), keys.blob("u2"), keys.request_id("-"), keys.pending],
        args=["u2", header, 1, 10, 60, "", keys.prefix, '["jpeg_compressibility"]', 10, "sig"],
    )
    assert out == [b"lost", b""]
    assert list(svc.redis.scan_iter(match="losttest:*")) == []


def test_reaper_requeues_a_dead_workers_tasks_then_fails_a_poison_task(svc):
    """Lua REAP on the real Redis (separate key prefix, no worker serves it): requeue, count, fail at max."""
    config = loads_service_config(
        f'token = "{TOKEN}"\nredis_prefix = "reaptest:"\n[workers]\nmax_attempts = 2\n'
        '[[reward_args]]\nreward_type = "jpeg_compressibility"\n'
    )
    keys, scripts = Keys("reaptest:"), Scripts.register(svc.redis)
    header = json.dumps({"shape": [2, 1, 1, 3], "media_type": "image"})
    svc.redis.set(keys.blob("u1"), b"npy", ex=60)  # the API stores the pixels just before the script
    scripts.enqueue(
        keys=[keys.task("u1"), keys.blob("u1"), keys.request_id("-"), keys.pending],
        args=["u1", header, 2, 10, 60, "", keys.prefix, '["jpeg_compressibility"]', 10, "sig"],
    )
    item = queue_item("jpeg_compressibility", "u1", 2)
    for attempt in (1, 2):
        svc.redis.hset(keys.workers, "ghost", json.dumps({"rewards": ["jpeg_compressibility"]}))
        claimed = scripts.claim(
            keys=[keys.queue("jpeg_compressibility"), keys.proc("ghost")],
            args=[64, 10, keys.prefix, "jpeg_compressibility"],
        )  # [Redis time, [item, header, created, attempts, stored result, signature]]
        assert claimed[1][0] == item.encode() and claimed[1][4] is None and claimed[1][5] == b"sig"
        assert json.loads(claimed[1][1]) == json.loads(header) and len(claimed) == 2
        assert int(claimed[1][3] or 0) == attempt - 1
        moved = reap_dead_workers(svc.redis, keys, config, scripts, result_key(TOKEN))
        assert int(svc.redis.hget(keys.task("u1"), "a:jpeg_compressibility")) == attempt
        assert svc.redis.hexists(keys.workers, "ghost") is False and svc.redis.exists(keys.proc("ghost")) == 0
        assert moved == (1 if attempt == 1 else 0)
    stored = open_result(
        result_key(TOKEN),
        "u1",
        "jpeg_compressibility",
        svc.redis.get(keys.result("u1", "jpeg_compressibility")),
    )
    assert stored["status"] == "failed" and "died 2 times (workers.max_attempts = 2)" in stored["error"]
    assert int(svc.redis.get(keys.pending)) == 0 and svc.redis.exists(keys.blob("u1")) == 0
    assert svc.redis.llen(keys.queue("jpeg_compressibility")) == 0


def test_memory_back_pressure_refuses_before_writing(svc):
    """With Redis above limits.max_queue_bytes an enqueue raises QueueFull (429) and writes nothing."""
    raw = body(images(1, 4), {"shapes": 1.0})
    parsed = parse_enqueue(raw, max_images=4, max_json_bytes=1000)

    async def enqueue() -> None:
        client = aioredis.Redis(port=svc.redis_port, password=REDIS_PASSWORD)
        try:
            broker = AsyncBroker(
                client,
                Keys("memtest:"),
                LimitsConfig(max_queue_bytes=1),
                WorkersConfig(),
                key=result_key(TOKEN),
            )
            await broker.enqueue(parsed, BodyDigests(raw, parsed.npy, parsed.request_id))
        finally:
            await client.aclose()

    with pytest.raises(QueueFull, match="limits.max_queue_bytes = 1"):
        asyncio.run(enqueue())
    assert list(svc.redis.scan_iter(match="memtest:*")) == []


SEED = body(images(2, 4, seed=9), {"jpeg_compressibility": 1.0}, metadata=[{"a": 1}, {"b": 2}])


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.binary(max_size=200),
        st.tuples(st.integers(0, len(SEED)), st.binary(min_size=1, max_size=6)).map(
            lambda t: SEED[: t[0]] + t[1] + SEED[t[0] + len(t[1]) :]
        ),
        st.integers(0, len(SEED)).map(lambda n: SEED[:n]),
    )
)
def test_fuzzed_enqueue_bodies_never_break_the_server(svc, data):
    status, _ = svc.a.enqueue(data)
    assert status in (200, 413, 422, 429)
    assert svc.a.health(token=None)[0] == 200


# ------------------------------------------------------------------------------------------------ reliability


def test_load_16_clients_x_50_requests_of_24_images(svc):
    """Zero lost, duplicated or mixed-up results; p50 / p99 latency and throughput are printed."""
    sets = [images(24, 32, seed=100 + i) for i in range(4)]
    expected = [JpegCompressibility().score(as_float(p), ["p"] * 24)["jpeg_compressibility"] for p in sets]
    floats = [as_float(p) for p in sets]
    latencies, uuids, errors = [], [], []
    lock = threading.Lock()

    def client(index: int) -> None:
        fn = remote(svc, ["jpeg_compressibility"], check=False, deadline_s=120)
        for i in range(50):
            k = (index + i) % 4
            start = time.perf_counter()
            try:
                task = fn.submit(floats[k], ["p"] * 24)
                result = task.result()
            except Exception as exc:  # collected and asserted below
                with lock:
                    errors.append(repr(exc))
                continue
            with lock:
                latencies.append(time.perf_counter() - start)
                uuids.append(task.uuid)
                if not torch.equal(result.total, expected[k]):
                    errors.append(f"client {index} request {i}: wrong scores")

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    elapsed = time.perf_counter() - start
    assert not any(t.is_alive() for t in threads), "load test clients hung"
    assert errors == []
    assert len(uuids) == 800 and len(set(uuids)) == 800
    lat = sorted(latencies)
    print(
        f"\nload: 16 clients x 50 requests x 24 images in {elapsed:.1f} s: {800 / elapsed:.1f} requests/s, "
        f"{800 * 24 / elapsed:.0f} images/s, latency p50 {statistics.median(lat) * 1000:.0f} ms, "
        f"p99 {lat[int(0.99 * len(lat))] * 1000:.0f} ms"
    )
    wait_for(lambda: pending(svc) == 0, what="no task left behind")


def holder_of(svc, uuid: str) -> tuple[str, int] | None:
    for raw_id, raw_info in svc.redis.hgetall(PREFIX + "workers").items():
        wid = raw_id.decode()
        if any(uuid in item.decode() for item in svc.redis.lrange(PREFIX + "proc:" + wid, 0, -1)):
            return wid, json.loads(raw_info)["pid"]
    return None


def test_kill_9_of_a_worker_mid_task_still_completes_the_task(svc):
    pixels = images(2, 8, seed=11)
    uuid = enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0}, metadata={"sleep": 2.0}))
    wait_for(lambda: holder_of(svc, uuid) is not None, what="a worker to claim the task")
    _, pid = holder_of(svc, uuid)
    os.kill(pid, signal.SIGKILL)
    status, answer = svc.a.result(uuid, "slow_mean", timeout=30)
    assert status == 200, answer
    assert answer["attempts"] == 2 and answer["scores"]["pid"][0] != pid  # another worker did it
    assert answer["scores"]["mean"] == pytest.approx(pixels.reshape(2, -1).mean(1) / 255, abs=1e-6)


def test_redis_restart_keeps_queued_tasks(svc):
    """SIGTERM to the embedded redis-server (it writes its append-only file); the service restarts it and every
    queued task is still answered - none vanishes."""
    sets = [images(1, 8, seed=20 + i) for i in range(6)]
    uuids = [enqueue_ok(svc.a, body(p, {"slow_mean": 1.0}, metadata={"sleep": 0.4})) for p in sets]
    pid = int(svc.redis.info("server")["process_id"])
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: _redis_pid(svc) not in (None, pid), timeout=30, what="redis-server to be restarted")
    for pixels, uuid in zip(sets, uuids, strict=True):
        status, answer = _result_through_outage(svc.a, uuid)
        assert status == 200, answer
        assert answer["scores"]["mean"] == pytest.approx([pixels.mean() / 255], abs=1e-6)


def _redis_pid(svc) -> int | None:
    try:
        return int(svc.redis.info("server")["process_id"])
    except redis.RedisError:
        return None


def _result_through_outage(service: Service, uuid: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        status, answer = service.result(uuid, "slow_mean", timeout=10)
        if status != 503 or time.monotonic() > deadline:
            return status, answer
        time.sleep(0.2)


def test_shutdown_stops_workers_and_the_embedded_redis(svc):
    workers = [w["pid"] for w in svc.a.health()[1]["workers"] if w["alive"]]
    assert svc.b.stop() == 0
    assert svc.a.stop() == 0
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=svc.redis_port, password=REDIS_PASSWORD, socket_connect_timeout=1).ping()
