"""2-process vs 1-process SFT throughput on CPU (samples/s of the global batch), printed side by side.

    python benchmarks/bench_multiprocess.py [--steps 8] [--batch 16] [--threads 1]

Both runs train the tiny SANA (`tiny-shapes-sft`, 32 px) on the shapes world with the same global batch; the
2-process run is `accelerate launch --multi_gpu --num_processes 2` (DDP over gloo). samples/s is the global batch
over the optimizer-step time (data + train), averaged over the steps after the first two (warm-up). Each process
gets `--threads` intra-op threads, so 2 processes use twice the cores of one: on a box with 2 idle cores the ideal
ratio is 2.0; DDP's gradient all-reduce and the duplicated per-process work (text encoding, imports) cost the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2


def worker(out: Path, steps: int, batch: int) -> None:
    """One training run (launched once per process)."""
    from sanarl import api
    from sanarl.methods.config_loading import load_config

    overrides = [
        f"train.output_dir={out}",
        f"train.max_num_steps={steps}",
        f"train.train_batch_per_replica={batch}",
        f"train.train_policy.mini_batch={batch // 2}",
        "train.resume=false",
        "validation.enable=false",
        "validation.val_before_train=false",
        "train.ckpt.enable_checkpoint=false",
        "train.ckpt.export_safetensors=false",
    ]
    api.train(
        load_config(ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml", overrides), "sanarl.datasets.shapes"
    )


def run(processes: int, steps: int, batch: int, threads: int, out: Path) -> tuple[float, float]:
    """(samples/s after warm-up, wall seconds) of one launch."""
    args = [str(Path(__file__).resolve()), "--worker", str(out), "--steps", str(steps), "--batch", str(batch)]
    if processes == 1:
        cmd = [sys.executable, *args]
    else:
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"]
        cmd = [
            *launch,
            "--num_processes",
            str(processes),
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            *args,
        ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(
            f"the {processes}-process run failed (exit {done.returncode}); stderr tail:\n{done.stderr[-3000:]}"
        )
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][WARMUP:]
    busy = sum(r["time_data"] + r["time_train"] for r in records)
    return batch * len(records) / busy, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="global batch (even: split over 2 processes)")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per process")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.batch)
        return
    if args.steps <= WARMUP:
        parser.error(f"--steps must exceed the {WARMUP} warm-up steps")
    if "SANARL_CACHE" not in os.environ:  # (setdefault would make an empty folder even when it is set)
        os.environ["SANARL_CACHE"] = tempfile.mkdtemp(prefix="sanarl-bench-cache-")
    with tempfile.TemporaryDirectory() as tmp:
        one, wall1 = run(1, args.steps, args.batch, args.threads, Path(tmp) / "one")
        two, wall2 = run(2, args.steps, args.batch, args.threads, Path(tmp) / "two")
    print(
        f"SFT tiny-shapes, global batch {args.batch}, {args.steps - WARMUP} timed steps, {args.threads} thread(s)/proc"
    )
    print(f"{'processes':<10} {'samples/s':>10} {'wall s':>8}")
    print(f"{1:<10} {one:>10.2f} {wall1:>8.1f}")
    print(f"{2:<10} {two:>10.2f} {wall2:>8.1f}")
    print(f"ratio 2-process / 1-process: {two / one:.2f}x")


if __name__ == "__main__":
    main()
