"""Every script of benchmarks/ runs to completion with tiny arguments and prints the ratio / result it exists for,
so none rots. Each runs as a user types it (`python benchmarks/<name>.py ...` from the repository root) in a
subprocess, with one intra-op thread (benchmarks/README.md, "Threads": two spin-waiting OpenMP threads on a busy
2-core box run up to 30x slower) and its temporary files under the test's tmp_path. Only the labels of the printed
lines are checked, never a timing or a measured value: the defaults are the measurement, these runs only prove the
code still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
"""Per script; the slowest tiny run takes ~25 s on 2 idle cores (two training launches of bench_multiprocess)."""


@dataclass(frozen=True)
class Bench:
    """One benchmark run: the script in benchmarks/, its tiny arguments, and label texts its output must contain."""

    script: str
    args: tuple[str, ...]
    labels: tuple[str, ...]


BENCHES = [
    Bench(
        "bench_eval.py",
        ("--batch", "4", "--repeats", "1", "--num", "4"),
        (
            "scorer throughput, 4 images",
            "jpeg_compressibility",
            "clipscore (tiny)",
            "ratio",
            "end to end, 4 held-out samples",
            "ms/image generate+score",
        ),
    ),
    Bench(
        "bench_lora_memory.py",
        ("--arch", "tiny", "--threads", "1"),
        ("before: frozen base float32", "after:  frozen base bf16", "peak RSS ratio after / before ="),
    ),
    Bench(
        "bench_memory.py",
        ("--steps", "1"),
        ("imports only", "training run", "peak RSS", "run - imports", "RSS timeline"),
    ),
    Bench(
        "bench_memory_options.py",
        ("--size", "32", "--batch", "2"),
        (
            "activations saved for backward",
            "gradient checkpointing",
            "bf16 autocast",
            "half the micro-batch",
            "full fine-tune, FSDP2 per rank, W=8",
            "LoRA r 16",
            "ratio",
        ),
    ),
    Bench(
        "bench_multiprocess.py",
        ("--steps", "3", "--batch", "4"),
        ("samples/s", "ratio 2-process / 1-process:"),
    ),
    Bench(
        "bench_nft_rollout.py",
        ("--prompts", "1", "--repeats", "1"),
        (
            "time ratio sol_rl / naive_scaling =",
            "reward ratio sol_rl / naive_scaling =",
            "overlap (shapes): sequential",
            "overlap (bench_slow_shapes): sequential",
        ),
    ),
    Bench(
        "bench_nft_shapes.py",
        ("--steps", "1", "--eval", "4"),
        ("held-out partial", "held-out strict", "ratio after / before (partial) ="),
    ),
    Bench(
        "bench_references.py",
        (
            "--prompts",
            "1",
            "--group",
            "2",
            "--steps",
            "2",
            "--size",
            "16",
            "--batch",
            "2",
            "--micro",
            "1",
            "--window",
            "1",
            "--rank",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--pairs",
            "grpo,nft,ff-nft",
            "--sanarl-set",
            "train.optm_lr=2e-4",
        ),  # fmt: skip
        (
            "== pair grpo: sanarl sd35m-grpo vs flow_grpo ==",
            "sanarl's preset also set: train.optm_lr=2e-4",
            "== pair nft: sanarl sd35m-nft vs DiffusionNFT ==",
            "== pair ff-nft: sanarl sd35m-nft vs Flow-Factory ==",
            "sanarl       rollout",
            "peak memory of an iteration",
            "(flow_grpo not given: sanarl's side only)",
            "(DiffusionNFT not given: sanarl's side only)",
            "(Flow-Factory not given: sanarl's side only)",
        ),
    ),
    Bench(
        "bench_reward_service.py",
        ("--images", "4", "--size", "32", "--repeats", "3"),
        (
            "in-process ms (p50)",
            "workers: remote ms (p50)",
            "inline: remote ms (p50)",
            "workers: overhead remote - in-process ms =",
            "inline: overhead remote - in-process ms =",
            "ratio remote / in-process =",
            "inline / workers remote ms =",
            "enqueue",
            "worker scoring",
            "ping (HTTP floor)",
            "bare app: both exchanges",
            "inline: overhead beyond the bare app's two exchanges ms =",
            "inline: overhead per request, paired ms (p25 / p50 / p75) =",
        ),
    ),
    Bench(
        "bench_runner_overhead.py",
        ("--repeats", "1"),
        ("runner split: time_data", "ratio runner / bare =", "ratio runner time_train / bare ="),
    ),
    Bench(
        "bench_sampler.py",
        ("--steps", "2", "--batch", "2", "--repeats", "1"),
        (
            "[sanarl-tiny:shapes] max |sanarl - diffusers|",
            "[sanarl-tiny:sana-dcae] max |sanarl - diffusers|",
            "[sanarl-tiny:flux] max |sanarl - diffusers|",
            "ratio sanarl / diffusers =",
        ),
    ),
]


def run_benchmark(bench: Bench, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/<script> <args>` from the repository root: no Hub, one thread, temp files under `tmp`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    return subprocess.run(
        [sys.executable, f"benchmarks/{bench.script}", *bench.args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_every_benchmark_script_has_a_run():
    scripts = {path.name for path in (ROOT / "benchmarks").glob("bench_*.py")}
    assert scripts == {bench.script for bench in BENCHES}


@pytest.mark.parametrize("bench", BENCHES, ids=[bench.script for bench in BENCHES])
def test_benchmark_runs_and_prints_its_result(bench: Bench, tmp_path: Path):
    done = run_benchmark(bench, tmp_path)
    report = f"python benchmarks/{bench.script} {' '.join(bench.args)}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    missing = [label for label in bench.labels if label not in done.stdout]
    assert missing == [], report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--pairs", "grpo,dpo"), "--pairs 'grpo,dpo': choose from grpo, nft, ff-grpo, ff-nft"),
        (("--flow-factory", "{tmp}"), "--flow-factory {tmp}: no src/flow_factory/trainers/nft.py there"),
        (
            ("--flow-factory", "{ff}", "--pairs", "ff-nft", "--batch", "4", "--micro", "2"),
            "the ff- pairs need --batch 4 = --micro 2",
        ),
        (
            ("--flow-grpo", "{tmp}", "--pairs", "grpo"),
            "--flow-grpo {tmp}: no scripts/train_sd3_fast.py there",
        ),
        (  # flow_grpo's side would accumulate over 1 // 2 = 0 batches (issue 45's NaN at these sizes)
            ("--flow-grpo", "{fg}", "--prompts", "1", "--group", "2", "--batch", "2", "--micro", "1"),
            "the grpo pair with --flow-grpo needs --micro 1 = --batch 2 and a multiple of 2 sampling batches "
            "(here 1)",
        ),
        (
            ("--pairs", "nft", "--sanarl-set", "train.compil=true"),
            "--sanarl-set: unknown key `train.compil` in --set `train.compil=true`; did you mean `train.compile`?",
        ),
    ],
    ids=[
        "unknown pair",
        "not a Flow-Factory checkout",
        "ff batch != micro",
        "not a flow_grpo checkout",
        "flow_grpo micro != batch",
        "unknown sanarl key",
    ],
)
def test_bench_references_refuses_bad_arguments_before_loading(args, message, tmp_path: Path):
    """Bad arguments of bench_references.py: the message names the flag and the fix, exit code 2, no model built."""
    ff = tmp_path / "Flow-Factory"
    (ff / "src/flow_factory/trainers").mkdir(parents=True)
    (ff / "src/flow_factory/trainers/nft.py").write_text("")
    fg = tmp_path / "flow_grpo"
    (fg / "scripts").mkdir(parents=True)
    (fg / "scripts/train_sd3_fast.py").write_text("")
    argv = [a.format(tmp=tmp_path, ff=ff, fg=fg) for a in args]
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_references.py", *argv],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message.format(tmp=tmp_path) in done.stderr
    assert "== pair" not in done.stdout and not list(tmp_path.glob("sanarl-bench-refs-*"))
