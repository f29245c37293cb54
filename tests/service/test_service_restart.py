"""A reward service that stops under its users (issue 41, items 3 and 4), through the CLI as users run it:

- a second `sanarl-reward` on a port in use exits 2 naming the port, before it starts any child process, and the
  first service keeps serving;
- the embedded Redis keeps its append-only file in a persistent folder: a service killed with -9 and started again
  on the same address serves the tasks queued before the kill;
- a task the service lost (its queue wiped between two starts) is enqueued again by the trainer's client, with a
  notice, and gets its real score;
- a DiffusionNFT job (`tiny-shapes-nft` with `use_remote_reward = true`) whose service is killed with -9 and
  started again while it runs finishes every step, exit 0.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from service_helpers import PLUGIN, TOKEN, Service, free_port, images, require_redis

from reward_service.embedded_redis import default_data_dir
from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards.remote import RemoteRewardFunction
from sanarl.training.tracking import read_metrics

pytestmark = [pytest.mark.service, pytest.mark.slow]


def config_text(port: int, *, log_level: str = "warning", rewards: tuple[str, ...] = ("slow_mean",)) -> str:
    """One general worker, the test plugin, a short visibility timeout (a killed worker's tasks come back fast)."""
    entries = "".join(f'[[reward_args]]\nreward_type = "{name}"\n' for name in rewards)
    return f"""
port = {port}
token = "{TOKEN}"
plugins = ["{PLUGIN}"]
log_level = "{log_level}"
[workers]
count = 1
visibility_timeout_s = 2.0
torch_threads = 1
{entries}"""


def as_float(array) -> torch.Tensor:
    return torch.from_numpy(array).permute(0, 3, 1, 2).float() / 255.0


def client(svc: Service) -> RemoteRewardFunction:
    return RemoteRewardFunction(
        RemoteRewardConfig(reward_fns=[RewardFnConfig(name="slow_mean")]),
        enqueue_url=f"{svc.url}/api/reward/enqueue",
        fetch_url=f"{svc.url}/api/reward/pull",
        token=TOKEN,
        backoff_s=0.1,
    )


def kill_9(svc: Service) -> None:
    assert svc.process is not None
    svc.process.kill()
    svc.process.wait()


def test_a_second_service_on_a_used_port_exits_2_naming_the_port(tmp_path):
    require_redis()
    port = free_port()
    first = Service(tmp_path, "first", config_text(port, log_level="info"), port).start()
    try:
        first.wait_healthy()
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "reward_service.cli", "--config", str(first.config)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        took = time.monotonic() - started
        assert second.returncode == 2, second.stderr[-3000:]
        message = " ".join(second.stderr.split())
        assert f"cannot listen on 127.0.0.1:{port}" in message and f"Port {port} is taken" in message
        assert "--port" in message and "Traceback" not in second.stderr
        # refused before any child: no redis-server, no worker was started (the log would say so at info level)
        assert "embedded redis-server" not in second.stderr and "worker" not in second.stderr.lower()
        assert took < 60, took
        status, health = first.health()
        assert status == 200 and health["rewards"]["slow_mean"]["workers"] == 1
        pixels = images(2, 8, seed=3)
        result = client(first)(as_float(pixels), ["a", "b"])
        assert result.total.tolist() == pytest.approx(
            (pixels.reshape(2, -1).mean(1) / 255).tolist(), abs=1e-6
        )
    finally:
        assert first.stop() == 0


def test_a_killed_service_keeps_its_queue_and_a_lost_task_is_enqueued_again(tmp_path, caplog):
    """kill -9 with a task in a worker and one queued: the next start on the same port replays the append-only
    file of the persistent folder and serves both. Then the folder is wiped between two starts: the client's
    pull finds the task unknown, enqueues it again (a logged notice) and returns its real score."""
    require_redis()
    port = free_port()
    svc = Service(tmp_path, "svc", config_text(port), port).start()
    folder = default_data_dir("127.0.0.1", port)
    try:
        svc.wait_healthy()
        assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"
        fn = client(svc)
        pixels = images(3, 8, seed=4)
        busy = fn.submit(as_float(pixels[:1]), ["busy"], [{"sleep": 3.0}])  # the worker holds it when killed
        waiting = fn.submit(as_float(pixels[1:]), ["x", "y"])  # queued behind it
        time.sleep(0.5)
        kill_9(svc)
        svc = Service(tmp_path, "svc", config_text(port), port).start()
        svc.wait_healthy()
        with caplog.at_level(logging.WARNING, logger="sanarl.rewards.remote"):
            means = [busy.result().total.tolist(), waiting.result().total.tolist()]
        expected = (pixels.reshape(3, -1).mean(1) / 255).tolist()
        assert means[0] + means[1] == pytest.approx(expected, abs=1e-6)
        assert busy.enqueues == 1 and waiting.enqueues == 1  # the queue survived: nothing was sent again
        assert "unknown to the service" not in caplog.text

        lost = fn.submit(as_float(pixels[:2]), ["a", "b"], [{"sleep": 3.0}] * 2)
        time.sleep(0.5)
        assert svc.stop() == 0
        shutil.rmtree(folder)  # the queue is gone for good
        svc = Service(tmp_path, "svc", config_text(port), port).start()
        svc.wait_healthy()
        first_uuid = lost.uuid
        with caplog.at_level(logging.WARNING, logger="sanarl.rewards.remote"):
            total = lost.result().total.tolist()
        assert total == pytest.approx(expected[:2], abs=1e-6)
        assert lost.enqueues == 2 and lost.uuid != first_uuid
        assert f"task {first_uuid} (slow_mean) is unknown to the service" in caplog.text
        assert "enqueued its images again" in caplog.text
    finally:
        assert svc.stop() == 0


def test_an_nft_job_finishes_across_a_kill_9_and_restart_of_its_service(tmp_path):
    """tiny-shapes-nft with use_remote_reward, 4 steps: once step 1 is logged the service is killed with -9; the
    job notices the outage (its log says so), the service is started again on the same port, the job finishes."""
    require_redis()
    port = free_port()
    toml = config_text(port, rewards=("shapes",))
    svc = Service(tmp_path, "svc", toml, port).start()
    out, log = tmp_path / "run", tmp_path / "job.log"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "REMOTE_REWARD_TOKEN": TOKEN,
        "REMOTE_REWARD_ENQUEUE_URL": f"{svc.url}/api/reward/enqueue",
        "REMOTE_REWARD_FETCH_URL": f"{svc.url}/api/reward/pull",
    }
    settings = ["train.train_policy.use_remote_reward=true", "train.max_num_steps=4", f"train.output_dir={out}",
                "rollout.n_generation=4", "rollout.batch_size=8", "train.train_batch_per_replica=8",
                "train.train_policy.mini_batch=8", "validation.enable=false", "validation.val_before_train=false",
                "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=false",
                "logging.multi_modal_log_interval=0"]  # fmt: skip
    command = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-nft", "sanarl.datasets.shapes"]
    for setting in settings:
        command += ["--set", setting]
    job = None
    try:
        svc.wait_healthy()
        with log.open("wb") as sink:
            job = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        wait_until(lambda: metrics_steps(out) >= 1, job, log, "step 1 logged", 600)
        kill_9(svc)
        wait_until(
            lambda: "is unavailable" in log.read_text(errors="replace"), job, log, "the outage notice", 300
        )
        svc = Service(tmp_path, "svc", toml, port).start()
        code = job.wait(timeout=900)
        text = log.read_text(errors="replace")
        assert code == 0, text[-4000:]
        assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
        assert "done: 4 steps" in text and "Traceback" not in text
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        svc.stop()


def metrics_steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(ready, job: subprocess.Popen, log: Path, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if job.poll() is not None:
            pytest.fail(f"the job exited with {job.returncode} before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
