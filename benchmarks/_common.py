"""Helpers shared by the benchmark scripts: tiny-model loading, interleaved timing, and a comparison table.

The scripts run from the repository root (`python benchmarks/bench_x.py`); this module sits next to them, so
`import _common` works without installing anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

TINY_MODELS = ("sanarl-tiny:shapes", "sanarl-tiny:sana-dcae")


def quiet() -> None:
    """Silence diffusers / transformers loading chatter (the same switch sanarl's CLI flips)."""
    from sanarl.api import quiet_libraries

    quiet_libraries()


def tiny_policy(model: str, max_prompt_length: int = 16):
    """A `PolicyConfig` for a tiny word-level model: no complex human instruction, short prompts."""
    from sanarl.config.schema import PolicyConfig

    policy = PolicyConfig(model_name_or_path=model)
    policy.diffusers.complex_human_instruction = False
    policy.diffusers.max_prompt_length = max_prompt_length
    return policy


def load_tiny(model: str, device: str = "cpu"):
    """The sanarl adapter of a tiny model (built into `$SANARL_CACHE` on first use), in eval mode."""
    from sanarl.models import load_adapter

    adapter = load_adapter(tiny_policy(model), device)
    adapter.transformer.eval()
    return adapter


def sync() -> None:
    """Wait for queued CUDA work so wall-clock timings are honest (no-op on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved_medians(
    contenders: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each contender `repeats` times, alternating A, B, A, B, ... so drift hits both alike.

    Every contender first runs `warmup` untimed calls. Returns the list of wall-clock seconds per contender;
    the caller takes medians (robust to the odd scheduler hiccup on a shared 2-core box).
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(repeats):
        order = list(contenders.items())
        if i % 2:  # also alternate who goes first, so neither always runs on a warmer cache
            order.reverse()
        for name, fn in order:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def describe_times(times: dict[str, list[float]]) -> str:
    """One line per contender: median and spread (min..max) in milliseconds."""
    lines = []
    for name, vals in times.items():
        lines.append(
            f"  {name:<12s} median {1e3 * median(vals):9.2f} ms   (min {1e3 * min(vals):.2f}, "
            f"max {1e3 * max(vals):.2f}, n={len(vals)})"
        )
    return "\n".join(lines)


def environment() -> str:
    """A one-line description of where the numbers come from."""
    import os

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus"
