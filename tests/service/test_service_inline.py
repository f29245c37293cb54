"""The reward service's inline mode (`[workers] inline = true`) end to end: a real `sanarl-reward` process that
scores in its own process on one thread - no redis-server, no worker processes - answered over real HTTP.

One inline instance serves the module (jpeg, shapes and the test plugin's `slow_mean`, a 3 s result TTL and a
2.5 s task deadline, so expiry and the deadline are testable); it needs no redis-server. Oracles: in-process reward
calls on the same pixels, hand-computed pixel means and the test's own counting of the limits. The CLI refusals
run as their own short-lived `python -m reward_service.cli` processes; SIGTERM of the instance runs last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from service_helpers import (
    HERE,
    PLUGIN,
    TOKEN,
    UNLOADABLE_PLUGIN,
    Service,
    as_float,
    assert_enqueue_refusals,
    assert_jpeg_scores_equal_in_process,
    assert_remote_equals_in_process,
    body,
    children,
    enqueue_ok,
    free_ports,
    http,
    images,
    wait_for,
)

from sanarl.rewards.scorers.jpeg import JpegCompressibility

pytestmark = pytest.mark.service

REWARDS = ("jpeg_compressibility", "jpeg_incompressibility", "shapes", "slow_mean")
MAX_PENDING = 8
RESULT_TTL_S = 3.0
DEADLINE_S = 2.5
REPO = HERE.parent.parent


def entries(names: tuple[str, ...] = REWARDS) -> str:
    return "".join(f'[[reward_args]]\nreward_type = "{name}"\n' for name in names)


def config_text(port: int) -> str:
    return f"""
port = {port}
token = "{TOKEN}"
plugins = ["{PLUGIN}"]
log_level = "warning"
[limits]
max_payload_bytes = 2000000
max_images = 64
max_pending_tasks = {MAX_PENDING}
result_ttl_s = {RESULT_TTL_S}
task_deadline_s = {DEADLINE_S}
max_pull_wait_s = 10
[workers]
inline = true
batch_images = 64
torch_threads = 1
{entries()}"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    """The inline instance (no Redis, no workers); stopped at the end."""
    tmp = tmp_path_factory.mktemp("reward-service-inline")
    (port,) = free_ports(1)
    service = Service(tmp, "inline", config_text(port), port).start()
    try:
        service.wait_healthy()
        yield SimpleNamespace(a=service, tmp=tmp)
    finally:
        service.stop()


def figures(svc) -> dict:
    status, answer = svc.a.health()
    assert status == 200, answer
    return answer


def running(svc, reward: str = "slow_mean") -> int:
    return figures(svc)["rewards"][reward]["running"]


def scored(svc, reward: str = "slow_mean") -> int:
    """Tasks of `reward` the scoring thread finished (the latency samples /health counts)."""
    return figures(svc)["rewards"][reward]["latency_s"]["count"]


def hold_the_scorer(svc, sleep: float, seed: int = 0) -> str:
    """A slow_mean task the scoring thread is busy with (waits until it is taken, so nothing batches with it)."""
    uuid = enqueue_ok(svc.a, body(images(1, 8, seed=seed), {"slow_mean": 1.0}, metadata={"sleep": sleep}))
    wait_for(lambda: running(svc) == 1, what="the scoring thread to take the slow task")
    return uuid


def means(pixels: np.ndarray) -> list[float]:
    return (pixels.reshape(len(pixels), -1).astype(np.float64).mean(axis=1) / 255.0).tolist()


# ------------------------------------------------------------------------------------------------ answers


def test_health_shows_the_api_process_as_the_one_worker_and_no_child_process(svc):
    status, public = svc.a.health(token=None)
    assert status == 200 and public["status"] == "ok" and "workers" not in public
    assert public["inline"] is True and "redis" not in public  # there is no Redis to report on
    jpeg = public["rewards"]["jpeg_compressibility"]
    assert (
        jpeg["keys"] == ["jpeg_compressibility", "jpeg_kb"] and jpeg["default_key"] == "jpeg_compressibility"
    )
    assert public["rewards"]["slow_mean"]["default_key"] == "mean"
    assert sorted(public["rewards"]) == sorted(REWARDS)
    assert all(public["rewards"][name]["workers"] == 1 for name in REWARDS)
    status, full = svc.a.health()
    assert status == 200 and len(full["workers"]) == 1, full
    (worker,) = full["workers"]
    assert worker["alive"] is True and worker["inline"] is True and worker["pid"] == svc.a.process.pid
    assert worker["rewards"] == sorted(REWARDS)
    assert [p for p in children(svc.a.process.pid)] == []  # no redis-server, no worker processes
    task_children = Path(f"/proc/{svc.a.process.pid}/task").glob("*/children")
    assert "".join(path.read_text() for path in task_children).split() == []


def test_jpeg_scores_equal_in_process_scores(svc):
    assert_jpeg_scores_equal_in_process(svc.a)


def test_remote_reward_function_equals_in_process_reward_function(svc):
    assert_remote_equals_in_process(svc.a, svc.a)


def test_pull_tells_pending_unknown_and_failed_apart(svc):
    pixels = images(2, 8, seed=2)
    uuid = enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0}, metadata={"sleep": 1.0}))
    status, answer = svc.a.pull(uuid, "slow_mean")
    assert status == 400 and answer["status"] == "pending" and answer["uuid"] == uuid
    assert answer["type"] == "slow_mean" and 0 <= answer["age_s"] < 1.0
    status, answer = svc.a.pull("0123-no-such-task", "slow_mean")
    assert status == 404 and answer["status"] == "unknown" and "unknown or expired" in answer["error"]
    status, answer = svc.a.pull(uuid, "shapes")
    assert status == 404 and answer["status"] == "unknown"
    assert "['slow_mean'], not 'shapes'" in answer["error"]
    status, answer = http(f"{svc.a.url}/api/reward/pull", b"type=slow_mean", svc.a.auth())
    assert status == 422 and "uuid" in answer["error"]
    bad = enqueue_ok(svc.a, body(pixels, {"shapes": 1.0}))  # shapes needs metadata: the reward refuses
    status, answer = svc.a.result(bad, "shapes")
    assert status == 500 and answer["status"] == "failed" and "reward 'shapes' failed" in answer["error"]
    assert "metadata" in answer["error"] and answer["uuid"] == bad and "scores" not in answer
    status, answer = svc.a.result(uuid, "slow_mean")
    assert status == 200 and answer["scores"]["mean"] == pytest.approx(means(pixels), abs=1e-6)
    assert answer["scores"]["pid"] == [float(svc.a.process.pid)] * 2  # scored in the API process


def test_enqueue_is_idempotent_by_request_id(svc):
    data = body(images(2, 8, seed=3), {"slow_mean": 1.0}, metadata={"sleep": 0.5}, request_id="trainer-42")
    before_pending, before_scored = figures(svc)["pending"], scored(svc)
    first, second = enqueue_ok(svc.a, data), enqueue_ok(svc.a, data)
    assert first == second
    assert figures(svc)["pending"] == before_pending + 1  # one task, not two
    status, answer = svc.a.enqueue(body(images(2, 8, seed=4), {"slow_mean": 1.0}, request_id="trainer-42"))
    assert status == 409 and answer["uuid"] == first and "request_id" in answer["error"]
    same_pixels = body(
        images(2, 8, seed=3), {"slow_mean": 1.0}, metadata={"sleep": 0.4}, request_id="trainer-42"
    )
    status, answer = svc.a.enqueue(same_pixels)  # other metadata under the same id: also a conflict
    assert status == 409 and answer["uuid"] == first
    status, answer = svc.a.result(first, "slow_mean")
    assert status == 200 and answer["attempts"] == 1 and answer["batch"] == {"tasks": 1, "images": 2}
    assert answer["scores"]["pid"] == [float(svc.a.process.pid)] * 2
    assert scored(svc) == before_scored + 1  # scored once
    assert enqueue_ok(svc.a, data) == first  # a retry after the result still gets the same uuid
    status, answer = svc.a.enqueue(same_pixels)  # checked against the digest kept once the pixels are dropped
    assert status == 409 and answer["uuid"] == first
    assert figures(svc)["pending"] == before_pending and scored(svc) == before_scored + 1


def test_tasks_of_one_reward_are_batched_across_requests(svc):
    blocker = hold_the_scorer(svc, sleep=1.5, seed=5)
    batches = [images(3, 8, seed=10 + i) for i in range(6)]
    uuids = [enqueue_ok(svc.a, body(p, {"slow_mean": 1.0})) for p in batches]
    assert svc.a.result(blocker, "slow_mean")[0] == 200
    answers = []
    for uuid in uuids:
        status, answer = svc.a.result(uuid, "slow_mean")
        assert status == 200, answer
        answers.append(answer)
    for pixels, answer in zip(batches, answers, strict=True):
        assert answer["scores"]["mean"] == pytest.approx(means(pixels), abs=1e-6)
        assert answer["scores"]["pid"] == [float(svc.a.process.pid)] * 3
    assert max(a["batch"]["tasks"] for a in answers) >= 2  # queued requests shared a scoring call
    assert all(a["batch"]["images"] <= 64 for a in answers)


def test_queue_full_answers_429_naming_the_limit_and_everything_accepted_is_scored(svc):
    before = figures(svc)["pending"]
    blocker = hold_the_scorer(svc, sleep=1.5, seed=6)
    accepted, sets, status, answer = [], [], 200, {}
    while status == 200 and len(accepted) < 3 * MAX_PENDING:
        pixels = images(1, 8, seed=60 + len(accepted))
        status, answer = svc.a.enqueue(body(pixels, {"slow_mean": 1.0}))
        if status == 200:
            accepted.append(answer["uuid"])
            sets.append(pixels)
    assert status == 429 and f"max_pending_tasks = {MAX_PENDING}" in answer["error"], answer
    assert len(accepted) == MAX_PENDING - before - 1  # the blocker holds one place
    assert figures(svc)["pending"] == MAX_PENDING
    two_rewards = body(images(1, 8), {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 1.0})
    assert svc.a.enqueue(two_rewards)[0] == 429
    assert svc.a.result(blocker, "slow_mean")[0] == 200
    for uuid, pixels in zip(accepted, sets, strict=True):
        status, answer = svc.a.result(uuid, "slow_mean")
        assert status == 200 and answer["scores"]["mean"] == pytest.approx(means(pixels), abs=1e-6)
    wait_for(lambda: figures(svc)["pending"] == 0, timeout=5, what="the queue to drain")
    assert enqueue_ok(svc.a, two_rewards)


def test_tasks_past_their_deadline_fail_unscored_and_the_service_goes_on(svc):
    before = scored(svc)
    slow = hold_the_scorer(svc, sleep=DEADLINE_S + 1.0, seed=7)
    # Queued behind it; each would hold the scorer for 8 s if it were scored.
    early = enqueue_ok(svc.a, body(images(1, 8, seed=8), {"slow_mean": 1.0}, metadata={"sleep": 8.0}))
    late = enqueue_ok(svc.a, body(images(1, 8, seed=9), {"slow_mean": 1.0}, metadata={"sleep": 8.0}))
    for uuid in (slow, early):  # failed by the pull that waits past the deadline
        status, answer = svc.a.pull(uuid, "slow_mean", wait=DEADLINE_S + 2)
        assert status == 500 and answer["status"] == "failed" and answer["uuid"] == uuid, answer
        assert f"limits.task_deadline_s = {DEADLINE_S:g} s" in answer["error"] and "scores" not in answer
    # `late` is not pulled until the scorer is free again: the scorer itself must fail it, not score it
    wait_for(lambda: running(svc) == 0, timeout=DEADLINE_S + 2, what="the slow task to end")
    status, answer = svc.a.pull(late, "slow_mean", wait=2.0)
    assert status == 500 and f"limits.task_deadline_s = {DEADLINE_S:g} s" in answer["error"], answer
    fresh = images(3, 16, seed=10)
    status, answer = svc.a.result(
        enqueue_ok(svc.a, body(fresh, {"jpeg_compressibility": 1.0})), "jpeg_compressibility"
    )
    assert status == 200, answer
    expected = JpegCompressibility().score(as_float(fresh), ["p"] * 3)["jpeg_compressibility"]
    assert answer["scores"]["jpeg_compressibility"] == expected.tolist()
    state = figures(svc)
    assert state["pending"] == 0 and state["rewards"]["slow_mean"]["running"] == 0
    assert state["rewards"]["slow_mean"]["queued"] == 0
    assert (
        scored(svc) == before
    )  # a result its deadline replaced is not kept, so not counted; none ran behind it
    pixels = images(2, 8, seed=11)
    status, answer = svc.a.result(enqueue_ok(svc.a, body(pixels, {"slow_mean": 1.0})), "slow_mean")
    assert status == 200 and answer["scores"]["mean"] == pytest.approx(means(pixels), abs=1e-6)


def test_results_expire_after_their_ttl_and_free_their_request_id(svc):
    data = body(images(2, 8, seed=12), {"jpeg_compressibility": 1.0}, request_id="expiry-1")
    uuid = enqueue_ok(svc.a, data)
    status, answer = svc.a.result(uuid, "jpeg_compressibility")
    assert status == 200, answer
    finished = time.monotonic()
    assert enqueue_ok(svc.a, data) == uuid  # kept: the request id still names it
    wait_for(
        lambda: svc.a.pull(uuid, "jpeg_compressibility")[0] != 200,
        timeout=RESULT_TTL_S + 3,
        what="the result to expire",
    )
    assert time.monotonic() - finished >= RESULT_TTL_S - 0.5  # not before its time
    status, answer = svc.a.pull(uuid, "jpeg_compressibility")
    assert status == 404 and answer["status"] == "unknown" and "unknown or expired" in answer["error"]
    assert f"limits.result_ttl_s = {RESULT_TTL_S:g} s" in answer["error"]
    other = images(2, 8, seed=13)
    fresh = enqueue_ok(svc.a, body(other, {"jpeg_compressibility": 1.0}, request_id="expiry-1"))
    assert fresh != uuid
    status, answer = svc.a.result(fresh, "jpeg_compressibility")
    expected = JpegCompressibility().score(as_float(other), ["p"] * 2)["jpeg_compressibility"]
    assert status == 200 and answer["scores"]["jpeg_compressibility"] == expected.tolist()


def test_pull_forms_are_read_as_clients_write_them(svc):
    """A urlencoded form with percent-escapes and a multipart form both pull; more than 16 fields is a 422 and a
    form over 64 KB a 413, each naming the limit; a malformed multipart form is the app's 400 and a GET its 405
    (the pull endpoint is called outside the app's routing: `serve_hot_paths`)."""
    uuid = enqueue_ok(svc.a, body(images(2, 8), {"jpeg_compressibility": 1.0}))
    url = f"{svc.a.url}/api/reward/pull"
    status, answer = http(url, f"uuid={uuid}&type=jpeg%5Fcompressibility&wait=20".encode(), svc.a.auth())
    assert status == 200 and answer["scores"]["jpeg_compressibility"]
    fields = {"uuid": uuid, "type": "jpeg_compressibility", "wait": "1"}
    parts = "".join(
        f'--b0\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()
    )
    multipart = {**svc.a.auth(), "Content-Type": "multipart/form-data; boundary=b0"}
    assert http(url, (parts + "--b0--\r\n").encode(), multipart) == (status, answer)
    many = "&".join(f"f{i}=1" for i in range(17)) + f"&uuid={uuid}&type=jpeg_compressibility"
    status, refused = http(url, many.encode(), svc.a.auth())
    assert status == 422 and "more than 16 fields" in refused["error"]
    status, refused = http(
        url, f"uuid={uuid}&type=jpeg_compressibility&pad={'x' * 70_000}".encode(), svc.a.auth()
    )
    assert status == 413 and "65536 bytes" in refused["error"]
    broken = {
        **svc.a.auth(),
        "Content-Type": "multipart/form-data",
    }  # no boundary: Starlette's parser refuses
    assert http(url, b"--x\r\n", broken)[0] == 400
    assert http(url, None, svc.a.auth())[0] == 405  # a GET: the app's own answer, as for any other route


def test_bad_input_gets_the_right_4xx_and_the_service_keeps_serving(svc):
    good = body(images(2, 8), {"jpeg_compressibility": 1.0})
    header, _ = good.split(b"\n", 1)
    cases = {
        "truncated": (good[:-7], 422, "truncated"),
        "no newline": (header, 422, "no newline"),
        "unknown reward": (body(images(2, 8), {"pickscore": 1.0}), 422, "unknown reward"),
        "too many images": (body(images(65, 1), {"jpeg_compressibility": 1.0}), 413, "max_images"),
    }
    before = figures(svc)["pending"]
    assert_enqueue_refusals(svc.a, cases, good)
    assert svc.a.pull("0123-no-such-task", "slow_mean", token="wrong-token-0123456789")[0] == 401
    assert figures(svc)["pending"] == before
    assert svc.a.result(enqueue_ok(svc.a, good), "jpeg_compressibility")[0] == 200


# ------------------------------------------------------------------------------------------------ refusals

INLINE = "[workers]\ninline = true\n"
REFUSALS = {
    # id: (config body after port / token / log level, extra arguments, fragments stderr must hold)
    "redis_url": (
        'redis_url = "redis://:hidden-redis-password-77@127.0.0.1:6390/0"\n' + INLINE + entries(("shapes",)),
        [],
        ["`workers.inline = true`", "`redis_url`", "redis://:***@127.0.0.1:6390/0", "remove one of the two"],
    ),
    "worker_groups": (
        INLINE + '[[worker_groups]]\nrewards = ["shapes"]\n' + entries(("shapes",)),
        [],
        ["`workers.inline = true`", "`[[worker_groups]]`", "remove the groups or set inline = false"],
    ),
    "--workers": (
        INLINE + entries(("shapes",)),
        ["--workers", "2"],
        ["--workers 2", "`workers.inline = true`", "drop --workers or set inline = false"],
    ),
    "unknown reward_type": (
        INLINE + entries(("no_such_reward",)),
        [],
        ["`reward_args[0]` (reward_type = 'no_such_reward')", "is not a known reward", "Known rewards:"],
    ),
    "rejected option": (
        INLINE + '[[reward_args]]\nreward_type = "jpeg_compressibility"\noptions = { bogus = 1 }\n',
        [],
        ["`reward_args[0]` (reward_type = 'jpeg_compressibility')", "does not accept the options ['bogus']"],
    ),
    "unloadable model": (
        'plugins = ["{plugin}"]\n' + INLINE + entries(("unloadable",)),
        [],
        ["`reward_args[0]` (reward_type = 'unloadable')", "cannot load its model (weights missing)"],
    ),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every refusal case run at once as `python -m reward_service.cli --config X [args]`: {id: finished run}."""
    tmp = tmp_path_factory.mktemp("refusals")
    plugin = tmp / "unloadable.py"
    plugin.write_text(UNLOADABLE_PLUGIN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("REMOTE_REWARD_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    ports = free_ports(len(REFUSALS))
    running_: dict[str, tuple[list[str], subprocess.Popen]] = {}
    for (case, (text, args, _)), port in zip(REFUSALS.items(), ports, strict=True):
        config = tmp / f"{case.strip('-').replace(' ', '_')}.toml"
        config.write_text(
            f'port = {port}\ntoken = "{TOKEN}"\nlog_level = "info"\n' + text.replace("{plugin}", str(plugin))
        )
        command = [sys.executable, "-m", "reward_service.cli", "--config", str(config), *args]
        process = subprocess.Popen(
            command, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        running_[case] = (command, process)
    runs = {}
    for case, (command, process) in running_.items():
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        runs[case] = subprocess.CompletedProcess(command, process.returncode, out, err)
    return runs


@pytest.mark.parametrize("case", list(REFUSALS))
def test_inline_refusals_exit_2_naming_the_key_and_the_fix(refused, case):
    run = refused[case]
    assert run.returncode == 2, (run.returncode, run.stderr[-3000:])
    assert "Traceback" not in run.stderr + run.stdout, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("sanarl-reward: error: "), run.stderr[-3000:]
    for fragment in REFUSALS[case][2]:
        assert fragment in last, (fragment, last)
    assert "serving" not in run.stderr  # refused before the API served
    assert "hidden-redis-password-77" not in run.stderr


# ------------------------------------------------------------------------------------------------ shutdown


def test_sigterm_stops_the_service_with_exit_code_0(svc):
    pid = svc.a.process.pid
    start = time.monotonic()
    assert svc.a.stop() == 0
    assert time.monotonic() - start < 15
    assert "Traceback" not in svc.a.log.read_text(errors="replace"), svc.a.log_tail()
    assert not Path(f"/proc/{pid}").exists() or children(pid) == {}
