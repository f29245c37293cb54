"""`python -m sanarl.tools.gpu_check`: a short self-contained check of the real code paths on one CUDA GPU.

Runs, in one process and through the same `sanarl.api.train` path as the CLI, on the embedded tiny SANA models
(no download): SFT steps (bf16 autocast on GPU, float32 on CPU), the same with `train.compile = true`
(torch.compile, mode "default"), one DiffusionNFT iteration, one SOAR step, and one Sol-RL two-stage rollout
iteration (FP8 preview when transformer-engine imports, else an unquantized preview). One line per check: PASS / FAIL / SKIP, seconds,
steps/s (optimizer steps over their data + train time), images/s (rollout images over rollout time), peak memory
(CUDA: max allocated; CPU: the process's peak RSS). Exit code 0 when every check passes or skips, 1 when one
fails, 2 when there is no GPU (pass `--allow-cpu` to run the same checks on CPU at a tiny size; the compile check
is skipped there: inductor's C++ build of the model takes minutes on CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

QUIET = [
    "validation.enable=false",
    "validation.val_before_train=false",
    "train.ckpt.enable_checkpoint=false",
    "train.ckpt.export_safetensors=false",
    "train.resume=false",
    "logging.multi_modal_log_interval=0",
    "rollout.reward_workers=0",
]


@dataclass
class Check:
    """One check: a shipped preset, its plugin and the overrides that size it (GPU size, CPU size)."""

    name: str
    preset: str
    plugin: str
    gpu: list[str]
    cpu: list[str]
    skip: Callable[[bool], str] = field(default=lambda cuda: "")
    """Reason to skip on this device ('' = run)."""


def fp8_available() -> bool:
    """transformer-engine imports (the FP8 preview of Sol-RL needs it)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001  (a broken install is "not available" here)
        return False
    return True


def checks() -> list[Check]:
    """The checks in the order they run."""
    sft_gpu = [
        "train.train_batch_per_replica=64",
        "train.train_policy.mini_batch=32",
        "train.max_num_steps=20",
    ]
    sft_cpu = ["train.train_batch_per_replica=8", "train.train_policy.mini_batch=8", "train.max_num_steps=2"]
    bf16 = ["train.param_dtype=bfloat16", "train.optm_warmup_steps=0"]
    nft_cpu = [
        "train.train_batch_per_replica=8",
        "rollout.n_generation=4",
        "train.train_policy.mini_batch=8",
        "policy.diffusers.sample.num_steps=4",
        "rollout.preview_step=2",
    ]
    preview = "fp8" if fp8_available() else "bf16"
    return [
        Check("sft", "tiny-shapes-sft", "sanarl.datasets.shapes", sft_gpu + bf16, sft_cpu),
        Check(
            "compile",
            "tiny-shapes-sft",
            "sanarl.datasets.shapes",
            [*sft_gpu[:2], "train.max_num_steps=5", *bf16, "train.compile=true"],
            [*sft_cpu, "train.compile=true"],
            skip=lambda cuda: "" if cuda else "inductor builds C++ kernels for minutes on CPU (GPU check only)",
        ),
        Check("nft", "tiny-shapes-nft", "sanarl.datasets.shapes", ["train.max_num_steps=1"], [*nft_cpu, "train.max_num_steps=1"]),
        Check(
            "soar",
            "tiny-shapes-soar",
            "sanarl.datasets.shapes",
            ["train.max_num_steps=1"],
            ["train.max_num_steps=1", "train.train_batch_per_replica=2", "train.train_policy.mini_batch=2"],
        ),
        Check(
            f"sol_rl_{preview}",
            "tiny-shapes-nft-solrl",
            "sanarl.datasets.shapes",
            ["train.max_num_steps=1", f"rollout.preview_precision={preview}"],
            [*nft_cpu, "rollout.num_candidates=8", "train.max_num_steps=1", "rollout.preview_precision=bf16"],
        ),
    ]  # fmt: skip


def _peak_memory_gib(cuda: bool) -> float:
    import torch

    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def run_check(check: Check, cuda: bool, workdir: Path) -> dict[str, float]:
    """Train the check's preset; returns seconds, steps/s, images/s (RL), peak memory in GiB."""
    import torch

    from sanarl import api
    from sanarl.config.presets import resolve_preset_path
    from sanarl.methods.config_loading import load_config
    from sanarl.training.tracking import read_metrics

    out = workdir / check.name
    overrides = [f"train.output_dir={out}", *QUIET, *(check.gpu if cuda else check.cpu)]
    loaded = load_config(resolve_preset_path(check.preset), overrides)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    api.train(loaded, check.plugin)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    records = read_metrics(out / "metrics.jsonl")
    busy = sum(r["time_data"] + r["time_train"] for r in records)
    result = {"s": seconds, "steps/s": len(records) / max(busy, 1e-9)}
    rollout_time = sum(r.get("time_rollout", 0.0) for r in records)
    if rollout_time > 0:
        result["images/s"] = sum(r.get("rollout_images", 0.0) for r in records) / rollout_time
    result["peak_GiB"] = _peak_memory_gib(cuda)
    if not all(torch.isfinite(torch.tensor(float(r["loss"]))) for r in records):
        raise RuntimeError(f"non-finite loss in {out / 'metrics.jsonl'}")
    return result


def format_line(status: str, name: str, values: dict[str, float], note: str = "") -> str:
    """`PASS  sft           s=12.3  steps/s=4.1  ...` (one line per check)."""
    parts = [f"{k}={v:.3g}" for k, v in values.items()]
    return f"{status:<5} {name:<14} " + "  ".join(parts) + (f"  ({note})" if note else "")


def main(argv: list[str] | None = None) -> int:
    """Run the checks; returns the exit code (0 ok, 1 a check failed, 2 no GPU without --allow-cpu)."""
    parser = argparse.ArgumentParser(
        prog="python -m sanarl.tools.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--allow-cpu", action="store_true", help="run the checks on CPU at a tiny size")
    parser.add_argument("--only", nargs="*", default=None, help="run only these checks (names as printed)")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(
            "error: gpu_check needs a CUDA GPU and none is visible (torch.cuda.is_available() is False); run it on a "
            "GPU machine, or pass --allow-cpu to run the same checks on CPU at a tiny size.",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"gpu_check on {device} (torch {torch.__version__}, fp8 preview: {fp8_available()})", flush=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sanarl-gpu-check-") as tmp:
        for check in checks():
            if args.only is not None and check.name not in args.only:
                continue
            reason = check.skip(cuda)
            if reason:
                print(format_line("SKIP", check.name, {}, reason), flush=True)
                continue
            try:
                print(format_line("PASS", check.name, run_check(check, cuda, Path(tmp))), flush=True)
            except Exception as err:  # noqa: BLE001  (a failed check is reported and counted, the others still run)
                failed += 1
                traceback.print_exc()
                print(format_line("FAIL", check.name, {}, f"{type(err).__name__}: {err}"), flush=True)
    print(f"{'FAILED' if failed else 'OK'}: {failed} check(s) failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
