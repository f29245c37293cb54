"""Peak resident memory of the embedded-default run (tiny shapes SFT) for N steps, in a child process.

Runs `sanarl --config tiny-shapes-sft sanarl.datasets.shapes --set train.max_num_steps=N
--set train.output_dir=<tmp> --set validation.enable=false` as a subprocess and reports:

- its peak RSS from the kernel (`os.wait4` -> `ru_maxrss`, KiB on Linux): the number to quote;
- the peak of psutil's RSS samples (every 50 ms) when psutil is installed, a cross-check and a timeline;
- the same for a child that only imports sanarl's CLI and its libraries (the floor no run can go below).

    python benchmarks/bench_memory.py [--steps 20] [--threads 1] [--plugin sanarl.datasets.shapes]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml"
IMPORTS_ONLY = (
    "import sanarl.cli, sanarl.api, sanarl.training.runner, torch, diffusers, transformers, accelerate"
)


@dataclass
class Usage:
    """What one child left: exit code, kernel peak RSS, psutil samples (MiB), wall seconds, stderr tail."""

    returncode: int
    maxrss_mib: float
    samples_mib: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    stderr_tail: str = ""


def _sample_rss(pid: int, out: list[float], stop: threading.Event, period: float = 0.05) -> None:
    """Append the RSS (MiB) of `pid` and its descendants every `period` s until `stop` is set or it exits."""
    try:
        import psutil
    except ImportError:
        return
    try:
        proc = psutil.Process(pid)
        while not stop.is_set():
            procs = [proc, *proc.children(recursive=True)]
            out.append(sum(p.memory_info().rss for p in procs) / 2**20)
            stop.wait(period)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return


def measure(cmd: list[str], env: dict[str, str]) -> Usage:
    """Run `cmd`, sampling its RSS; reap it with `os.wait4` to read the kernel's peak RSS of the child."""
    t0 = time.perf_counter()
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    samples: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(proc.pid, samples, stop), daemon=True)
    sampler.start()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    stop.set()
    sampler.join()
    err.seek(0)
    tail = err.read().decode(errors="replace")[-2000:]
    return Usage(proc.returncode, rusage.ru_maxrss / 1024, samples, time.perf_counter() - t0, tail)


def timeline(samples: list[float], slices: int = 10) -> str:
    """Peak RSS of each of `slices` equal time slices of the samples, e.g. "350 720 1510 1546 ..."."""
    n = len(samples)
    bounds = [round(i * n / slices) for i in range(slices + 1)]
    peaks = [max(samples[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return " ".join(f"{p:.0f}" for p in peaks)


def report(label: str, usage: Usage) -> None:
    line = f"  {label:<14s} peak RSS {usage.maxrss_mib:8.1f} MiB (ru_maxrss)"
    if usage.samples_mib:
        line += f", {max(usage.samples_mib):8.1f} MiB (psutil peak of {len(usage.samples_mib)} samples)"
    print(line + f", wall {usage.wall_s:.1f} s, exit {usage.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--plugin", default="sanarl.datasets.shapes")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the child (0 = unset)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    print(f"embedded default run: {PRESET.name} + {args.plugin}, {args.steps} steps, validation off")
    with tempfile.TemporaryDirectory(prefix="sanarl-mem-") as tmp:
        floor = measure([sys.executable, "-c", IMPORTS_ONLY], env)
        run = [sys.executable, "-m", "sanarl", "--config", str(PRESET), args.plugin]
        for item in (
            f"train.max_num_steps={args.steps}",
            f"train.output_dir={tmp}",
            "validation.enable=false",
        ):
            run += ["--set", item]
        usage = measure(run, env)
    report("imports only", floor)
    report("training run", usage)
    if usage.returncode != 0:
        print(f"training run failed; stderr tail:\n{usage.stderr_tail}")
        return 1
    print(
        f"  run - imports  {usage.maxrss_mib - floor.maxrss_mib:8.1f} MiB (model, optimizer, EMA, activations)"
    )
    if usage.samples_mib:
        print(f"  RSS timeline (MiB, {usage.wall_s:.0f} s in 10 slices): {timeline(usage.samples_mib)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
