"""The reward service's fixed cost per request, measured side by side with in-process scoring.

    python benchmarks/bench_reward_service.py                       # 24 images of 64x64, both designs, 60 repeats
    python benchmarks/bench_reward_service.py --images 4 --size 32 --repeats 3     # what CI runs

Two real `sanarl-reward` services on 127.0.0.1 score the same float batch `[B, 3, H, W]` as `RewardFunction` does
in this process: `workers` (the default design: embedded redis-server, one worker process) and `inline` (`[workers]
inline = true`: the API process scores, no Redis, no worker process; `--designs` picks). In-process scoring and
one request to each service alternate after a warm-up (so background load hits all alike) and medians are printed
per design: in-process ms, remote ms, their difference (the overhead of the hop) and ratio, the quartiles of the
per-request difference (each request against the in-process call just before it), and inline / workers.
The hop is then split, per request, into the client's input checks and body encoding (`request_body`, what
`submit` does before it sends), the enqueue round trip, the pull round trip
(which waits for the worker) and the worker's own scoring time (the result's `duration`); the HTTP floor is a
token-checked ping. The machine's floor for the protocol is timed in the same loop: the same two exchanges (the
same enqueue body, then a pull-sized form) with a bare ASGI app under the same uvicorn, which answers at once and
runs no sanarl code; what a design adds beyond it is the service's own part of the overhead. What the overhead is
made of: overhead = remote - in-process ~= encode + enqueue + (pull - worker scoring) + (worker scoring -
in-process scoring). The worker's scoring is its `score_uint8` call on the pixels as received: a reward that judges
uint8 pixels (jpeg, shapes) scores them as they are (the quantisation in-process scoring does inside the reward is
the client's encoding here), a float reward pays the uint8 -> float decode in it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid as uuidlib
from pathlib import Path

import numpy as np
import torch
from _common import environment

from reward_service.benchmark import free_port, start_service, wait_answering
from sanarl.config.schema import RemoteRewardConfig, RewardFnConfig
from sanarl.rewards.combine import RewardFunction
from sanarl.rewards.remote import RemoteRewardFunction, RemoteTask, _request

BARE = "bare app: both exchanges"
"""The two POSTs of a request (its body, then a pull-sized form) to a bare ASGI app under the same uvicorn."""

STAGES = ("encode", "enqueue", "pull", "worker scoring", "ping (HTTP floor)", BARE)


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


async def _bare_app(scope: dict, receive, send) -> None:
    """An ASGI app that reads the request body and answers 200 `{}` at once: the HTTP floor of one exchange."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": b"{}"})


def _serve_bare(port: int) -> None:
    """uvicorn on 127.0.0.1:`port` with the service's HTTP stack (httptools, uvloop) serving `_bare_app`."""
    import uvicorn

    uvicorn.run(_bare_app, host="127.0.0.1", port=port, log_level="warning", http="httptools", loop="uvloop")


def _start_bare() -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, __file__, "--serve-bare", str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    wait_answering(process, url, "the bare HTTP server", 30.0)
    return process, url


def _one_bare(url: str, body: bytes) -> float:
    """Seconds of a request's two exchanges with the bare app: the enqueue body, then a pull-sized form."""
    form = urllib.parse.urlencode({"uuid": str(uuidlib.uuid4()), "type": "reward", "wait": "10.000"}).encode()
    start = time.perf_counter()
    _request(f"{url}/api/reward/enqueue", body, {"Content-Type": "application/octet-stream"}, 60.0)
    _request(f"{url}/api/reward/pull", form, {"Content-Type": "application/x-www-form-urlencoded"}, 60.0)
    return time.perf_counter() - start


DESIGNS = ("workers", "inline")
"""The two ways the service scores: worker processes fed through Redis (the default), and `[workers] inline =
true` (the API process scores on a thread: no Redis, no worker process)."""


def measure(
    urls: dict[str, str], token: str, reward: str, images: torch.Tensor, repeats: int, bare: str
) -> dict[str, dict[str, list[float]]]:
    """Seconds per stage of each design's requests (`_one_remote`), of in-process scoring and of the same
    exchanges with the bare app at `bare`, interleaved: each repeat runs in-process, then one request to each
    service, then the bare exchanges, so background load hits all alike."""
    config = RemoteRewardConfig(reward_fns=[RewardFnConfig(name=reward)])
    local = RewardFunction(config)
    remotes = {
        design: RemoteRewardFunction(
            config, enqueue_url=f"{url}/api/reward/enqueue", fetch_url=f"{url}/api/reward/pull", token=token
        )
        for design, url in urls.items()
    }
    prompts = ["benchmark"] * len(images)
    body = next(iter(remotes.values())).request_body(images, prompts)[0]
    for _ in range(2):  # warm-up: connections, the first batch, allocator
        local(images, prompts)
        for remote in remotes.values():
            _one_remote(remote, images, prompts)
        _one_bare(bare, body)
    samples: dict[str, dict[str, list[float]]] = {design: {"in-process": []} for design in remotes}
    for _ in range(repeats):
        start = time.perf_counter()
        local(images, prompts)
        seconds = time.perf_counter() - start
        for design, remote in remotes.items():
            samples[design]["in-process"].append(seconds)
            for key, value in _one_remote(remote, images, prompts).items():
                samples[design].setdefault(key, []).append(value)
        floor = _one_bare(bare, body)
        for stages in samples.values():
            stages.setdefault(BARE, []).append(floor)
    return samples


def paired_overhead(stages: dict[str, list[float]]) -> tuple[float, float, float]:
    """Quartiles (ms) of remote - in-process taken per repeat: each request against the in-process call just
    before it, so load that drifts between repeats cancels (the difference of medians above does not pair them)."""
    differences = [1000 * (r - i) for r, i in zip(stages["remote"], stages["in-process"], strict=True)]
    if len(differences) < 2:
        return (differences[0],) * 3
    low, mid, high = statistics.quantiles(differences, n=4)
    return low, mid, high


def report(samples: dict[str, dict[str, list[float]]], images: int, size: int) -> None:
    ms = {
        design: {key: 1000 * statistics.median(values) for key, values in stages.items()}
        for design, stages in samples.items()
    }
    first = next(iter(samples.values()))
    print(
        f"reward service hop, {images} images of {size}x{size}, medians of {len(first['remote'])} requests each"
    )
    print(f"  in-process ms (p50)     {next(iter(ms.values()))['in-process']:8.2f}")
    for design, row in ms.items():
        print(f"  {design}: remote ms (p50) {row['remote']:8.2f}")
        print(f"  {design}: overhead remote - in-process ms = {row['remote'] - row['in-process']:.2f}")
        print(f"  {design}: ratio remote / in-process = {row['remote'] / row['in-process']:.3f}")
        beyond = row["remote"] - row["in-process"] - row[BARE]
        print(f"  {design}: overhead beyond the bare app's two exchanges ms = {beyond:.2f}")
        low, mid, high = paired_overhead(samples[design])
        print(
            f"  {design}: overhead per request, paired ms (p25 / p50 / p75) = {low:.2f} / {mid:.2f} / {high:.2f}"
        )
    if len(ms) == 2:
        a, b = ms["inline"], ms["workers"]
        print(f"  inline / workers remote ms = {a['remote'] / b['remote']:.3f}")
    print("  stages of one remote request (ms, p50):   " + "".join(f"{d:>10}" for d in ms))
    for stage in STAGES:
        print(f"    {stage:<38}" + "".join(f"{row[stage]:10.2f}" for row in ms.values()))
    label = "pull - worker scoring (waits, hand-offs)"
    print(f"    {label:<38}" + "".join(f"{row['pull'] - row['worker scoring']:10.2f}" for row in ms.values()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reward", default="jpeg_compressibility")
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of this process")
    parser.add_argument(
        "--designs", nargs="+", choices=DESIGNS, default=list(DESIGNS), help="services to time"
    )
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the bare app
    args = parser.parse_args(argv)
    if args.serve_bare:
        _serve_bare(args.serve_bare)
        return
    torch.set_num_threads(args.threads)
    token = secrets.token_urlsafe(32)
    images = _images(args.images, args.size)
    with tempfile.TemporaryDirectory(prefix="sanarl-bench-service-") as tmp:
        processes, urls = [], {}
        try:
            bare_process, bare = _start_bare()
            processes.append(bare_process)
            for design in args.designs:
                process, urls[design] = start_service(
                    Path(tmp), args.reward, 1, token, inline=design == "inline"
                )
                processes.append(process)
            samples = measure(urls, token, args.reward, images, args.repeats, bare)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=60)
    print(f"{environment()}, redis-py reply parser: {_reply_parser()}")
    report(samples, args.images, args.size)


def _reply_parser() -> str:
    """Which parser reads Redis' replies: hiredis (C) when installed, else redis-py's pure-Python one."""
    from redis.utils import HIREDIS_AVAILABLE

    return "hiredis" if HIREDIS_AVAILABLE else "pure Python (hiredis not installed)"


if __name__ == "__main__":
    main()
