"""Measure a run's peak memory on the CPU and compare it with `sanarl validate`'s estimate (docs/results.md,
"Memory plan against measurement").

    python scripts/measure_capacity.py --steps 2 -- --config tiny-shapes-nft sanarl.datasets.shapes [--set ...]

Method: the run goes in a fresh process with glibc's dynamic mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=65536,
so every tensor of 64 KiB or more is its own mapping, returned to the system when freed) and one OpenMP thread.
After every module the run imports is imported, the kernel's peak-RSS mark is reset (`5 > /proc/self/clear_refs`)
and the resident size noted; the run's measured peak is VmHWM minus that baseline. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys
import sanarl.api, sanarl.cli, sanarl.training.runner, sanarl.methods.registry, sanarl.tools.capacity.fit
import sanarl.methods.nft.task, sanarl.methods.flow_grpo.task, sanarl.methods.sft.task, sanarl.methods.soar.task
import sanarl.datasets.shapes, sanarl.rewards.shapes, diffusers, peft, transformers.models.gemma2.modeling_gemma2


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024


import gc
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
code = 0
try:
    sanarl.cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("MEASURED " + json.dumps({"peak": status("VmHWM") - base, "code": code}))
"""


def measure(args: list[str], steps: int) -> dict:
    """{"measured", "estimated", "error", "phase"} of the training run `args` for `steps` optimizer steps."""
    from sanarl.config import load_config
    from sanarl.config.presets import resolve_preset_path
    from sanarl.tools.capacity.memory import estimate

    with tempfile.TemporaryDirectory() as out:
        run = [*args, "--set", f"train.max_num_steps={steps}", "--set", f"train.output_dir={out}",
               "--set", "train.ckpt.enable_checkpoint=false", "--set", "train.ckpt.export_safetensors=false"]  # fmt: skip
        env = {
            **os.environ,
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "MALLOC_TRIM_THRESHOLD_": "0",
            "OMP_NUM_THREADS": "1",
        }
        proc = subprocess.run([sys.executable, "-c", CHILD, *run], env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MEASURED ")]
        if not lines or json.loads(lines[-1][9:])["code"] not in (0, None):
            raise RuntimeError(f"the measured run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        measured = json.loads(lines[-1][9:])["peak"]
    config = args[args.index("--config") + 1]
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    est = estimate(
        load_config(resolve_preset_path(config), overrides).config, 1, False, both_checkpointing=False
    )
    peak = est.peak.total
    return {"measured": measured, "estimated": peak, "error": peak / measured - 1, "phase": est.peak.name}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    result = measure(args, ns.steps)
    mib = 2**20
    print(f"measured {result['measured'] / mib:.1f} MiB, estimated {result['estimated'] / mib:.1f} MiB "
          f"({result['phase']}), error {result['error']:+.1%}")  # fmt: skip
