"""Benchmarks of the reward service on loopback (issue 5): remote vs in-process latency, throughput per worker count.

    python -m reward_service.benchmark                      # 24 images of 64x64, jpeg_compressibility
    python -m reward_service.benchmark --workers 1 2 4 --clients 8 --requests 40 --json out.json
    python -m reward_service.benchmark --layout channels_last   # pixels stored channels-last (see below)

For each worker count a real `sanarl-reward` (embedded redis-server, 127.0.0.1 only) is started, then:
- latency: one client scores the same batch `--repeats` times through `RemoteRewardFunction` and in-process
  through `RewardFunction`, alternating; medians and their ratio (remote / in-process) are reported;
- throughput: `--clients` threads each send `--requests` requests; requests/s, images/s, p50 / p99 latency.
The images are float `[B, 3, H, W]` in [0, 1], contiguous as a VAE decode returns them (`--layout nchw`, the
default); `--layout channels_last` stores the same values channels-last, which makes in-process uint8 conversion
(`sanarl.rewards.base.to_uint8_hwc`) cheaper, so both ratios are worth reporting. Needs redis-server on PATH.
Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards.combine import RewardFunction
from sanarl.rewards.remote import RemoteRewardFunction


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_service(
    directory: Path, reward: str, workers: int, token: str, inline: bool = False
) -> tuple[subprocess.Popen, str]:
    """A `sanarl-reward` process with `workers` workers serving `reward` (with `inline`, no workers: the API
    process scores); returns (process, base URL) once healthy."""
    port = free_port()
    config = directory / f"bench-{workers}{'-inline' if inline else ''}.toml"
    mode = "inline = true" if inline else f"count = {workers}"
    config.write_text(
        f'port = {port}\ntoken = "{token}"\nlog_level = "warning"\n[workers]\n{mode}\ntorch_threads = 1\n'
        f'[limits]\nmax_pending_tasks = 100000\n[[reward_args]]\nreward_type = "{reward}"\n'
        f'[redis]\ndata_dir = "{directory / f"redis-{workers}"}"\n'  # its queue folder goes with the run
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "reward_service.cli", "--config", str(config)], env=env)
    url = f"http://127.0.0.1:{port}"
    wait_answering(process, f"{url}/health", "the service", 180.0)
    return process, url


def wait_answering(process: subprocess.Popen, url: str, what: str, seconds: float) -> None:
    """Return once GET `url` answers 200; RuntimeError naming `what` when `process` exits first, or (the process
    killed) when `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{what} did not answer {url} within {seconds:g} s")


def latency(
    remote: Any, local: Any, images: torch.Tensor, prompts: list[str], repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds per call of `remote(images, prompts)` and `local(images, prompts)`, alternating (so background load
    hits both alike), after one warm-up call of each."""
    remote(images, prompts)
    local(images, prompts)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((remote, times[0]), (local, times[1])):
            start = time.perf_counter()
            fn(images, prompts)
            out.append(time.perf_counter() - start)
    return times


def throughput(make_fn: Any, images: torch.Tensor, prompts: list[str], clients: int, requests: int) -> dict:
    """`clients` threads x `requests` calls; requests/s, images/s and latency percentiles."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        fn = make_fn()
        for _ in range(requests):
            start = time.perf_counter()
            fn(images, prompts)
            with lock:
                latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    lat = sorted(latencies)
    return {
        "requests_per_s": round(len(lat) / elapsed, 2),
        "images_per_s": round(len(lat) * images.shape[0] / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the module doc, as one dict."""
    generator = np.random.default_rng(0)
    pixels = generator.integers(0, 256, (args.images, args.size, args.size, 3), dtype=np.uint8)
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0  # channels-last strides
    if args.layout == "nchw":
        images = images.contiguous()
    prompts = ["benchmark"] * args.images
    config = RemoteRewardConfig(reward_fns=[RewardFnConfig(name=args.reward)])
    local = RewardFunction(config)
    report: dict[str, Any] = {
        "reward": args.reward,
        "images": args.images,
        "size": args.size,
        "layout": args.layout,
        "runs": [],
    }
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="sanarl-bench-") as tmp:
        for workers in args.workers:
            process, url = start_service(Path(tmp), args.reward, workers, token)
            try:
                make = functools.partial(
                    RemoteRewardFunction,
                    config,
                    enqueue_url=f"{url}/api/reward/enqueue",
                    fetch_url=f"{url}/api/reward/pull",
                    token=token,
                )
                remote, inproc = latency(make(), local, images, prompts, args.repeats)
                row = {
                    "workers": workers,
                    "remote_ms": round(1000 * statistics.median(remote), 2),
                    "in_process_ms": round(1000 * statistics.median(inproc), 2),
                }
                row["ratio"] = round(row["remote_ms"] / row["in_process_ms"], 3)
                row.update(throughput(make, images, prompts, args.clients, args.requests))
                report["runs"].append(row)
                print(json.dumps(row), flush=True)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reward_service.benchmark", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--reward", default="jpeg_compressibility")
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=30, help="latency samples per path")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients of the throughput run")
    parser.add_argument("--requests", type=int, default=25, help="requests per client of the throughput run")
    parser.add_argument("--layout", choices=("nchw", "channels_last"), default="nchw", help="memory layout")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
