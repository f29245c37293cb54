"""The reward service's fixed cost per request, measured side by side with in-process scoring.

    python benchmarks/bench_reward_service.py                       # 24 images of 64x64, 1 worker, 60 repeats
    python benchmarks/bench_reward_service.py --images 4 --size 32 --repeats 3     # what CI runs

A real `sanarl-reward` (embedded redis-server, one worker, 127.0.0.1) scores the same float batch `[B, 3, H, W]`
as `RewardFunction` does in this process; the two paths alternate after a warm-up (so background load hits both
alike) and medians are printed: in-process ms, remote ms, their difference (the overhead of the hop) and ratio.
The hop is then split, per request, into the client's input checks and body encoding (`request_body`, what
`submit` does before it sends), the enqueue round trip, the pull round trip
(which waits for the worker) and the worker's own scoring time (the result's `duration`); the HTTP floor is a
token-checked ping. What the overhead is made of: overhead = remote - in-process ~= encode + enqueue + (pull -
worker scoring) + (worker scoring - in-process scoring). The worker's scoring is its `score_uint8` call on the
pixels as received: a reward that judges uint8 pixels (jpeg, shapes) scores them as they are (the quantisation
in-process scoring does inside the reward is the client's encoding here), a float reward pays the uint8 -> float
decode in it.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
import urllib.parse
from pathlib import Path

import numpy as np
import torch
from _common import environment

from reward_service.benchmark import start_service
from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards.combine import RewardFunction
from sanarl.rewards.remote import RemoteRewardFunction, RemoteTask, _request

STAGES = ("encode", "enqueue", "pull", "worker scoring", "ping (HTTP floor)")


def _images(count: int, size: int) -> torch.Tensor:
    pixels = np.random.default_rng(0).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return (torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0).contiguous()  # as a VAE decode


def _one_remote(fn: RemoteRewardFunction, images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    """One request through the service, timed stage by stage (seconds): what `fn(images, prompts)` does."""
    t0 = time.perf_counter()
    body, bad = fn.request_body(images, prompts)  # the input checks and the encoding, as `submit` does them
    t1 = time.perf_counter()
    task = RemoteTask(fn, fn._enqueue(body), len(prompts), bad, body)
    t2 = time.perf_counter()
    answers = {name: fn._pull(task, name) for name in fn.names}
    t3 = time.perf_counter()
    fn._combine(task, answers)
    t4 = time.perf_counter()
    form = urllib.parse.urlencode({"info_data": "bench"}).encode()
    _request(fn.ping_url, form, fn._headers("application/x-www-form-urlencoded"), fn.timeout_s)
    t5 = time.perf_counter()
    scoring = sum(float(a.get("duration", 0.0) or 0.0) for a in answers.values())
    return {"remote": t4 - t0, "encode": t1 - t0, "enqueue": t2 - t1, "pull": t3 - t2,
            "worker scoring": scoring, "ping (HTTP floor)": t5 - t4}  # fmt: skip


def measure(url: str, token: str, reward: str, images: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    config = RemoteRewardConfig(reward_fns=[RewardFnConfig(name=reward)])
    local = RewardFunction(config)
    remote = RemoteRewardFunction(
        config, enqueue_url=f"{url}/api/reward/enqueue", fetch_url=f"{url}/api/reward/pull", token=token
    )
    prompts = ["benchmark"] * len(images)
    for _ in range(2):  # warm-up: connections, the worker's first batch, allocator
        local(images, prompts)
        _one_remote(remote, images, prompts)
    samples: dict[str, list[float]] = {"in-process": []}
    for _ in range(repeats):
        start = time.perf_counter()
        local(images, prompts)
        samples["in-process"].append(time.perf_counter() - start)
        for key, seconds in _one_remote(remote, images, prompts).items():
            samples.setdefault(key, []).append(seconds)
    return samples


def report(samples: dict[str, list[float]], images: int, size: int) -> None:
    ms = {key: 1000 * statistics.median(values) for key, values in samples.items()}
    print(
        f"reward service hop, {images} images of {size}x{size}, medians of {len(samples['remote'])} requests"
    )
    print(f"  in-process ms (p50)     {ms['in-process']:8.2f}")
    print(f"  remote ms (p50)         {ms['remote']:8.2f}")
    print(f"  overhead remote - in-process ms = {ms['remote'] - ms['in-process']:.2f}")
    print(f"  ratio remote / in-process = {ms['remote'] / ms['in-process']:.3f}")
    print("  stages of one remote request (ms, p50):")
    for stage in STAGES:
        print(f"    {stage:<20} {ms[stage]:8.2f}")
    print(f"    pull - worker scoring (waits, wake-ups, Redis) {ms['pull'] - ms['worker scoring']:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reward", default="jpeg_compressibility")
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of this process")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    token = secrets.token_urlsafe(32)
    images = _images(args.images, args.size)
    with tempfile.TemporaryDirectory(prefix="sanarl-bench-service-") as tmp:
        process, url = start_service(Path(tmp), args.reward, 1, token)
        try:
            samples = measure(url, token, args.reward, images, args.repeats)
        finally:
            process.terminate()
            process.wait(timeout=60)
    print(f"{environment()}, redis-py reply parser: {_reply_parser()}")
    report(samples, args.images, args.size)


def _reply_parser() -> str:
    """Which parser reads Redis' replies: hiredis (C) when installed, else redis-py's pure-Python one."""
    from redis.utils import HIREDIS_AVAILABLE

    return "hiredis" if HIREDIS_AVAILABLE else "pure Python (hiredis not installed)"


if __name__ == "__main__":
    main()
