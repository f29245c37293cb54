"""Golden first steps: each method's first 2 optimizer steps on the shipped tiny presets, run through the CLI as a
user types it, must log the loss, grad norm and reward recorded in tests/data/golden_steps.json.

Invariant tests (a loss is finite, an adapter moves) let a numerics change through; these values do not. Each run
is `python -m sanarl --config PRESET sanarl.datasets.shapes --set ...` (the `--set` values of RUNS below make it
short: 2 steps, small batches, no validation, checkpoint or export) in a fresh folder, single-threaded
(OMP_NUM_THREADS=1, so the values do not depend on the machine's core count; the runs go side by side instead) and
on the AVX2 kernels (ATen's dispatch, MKL's conditional numerical reproducibility and oneDNN's instruction set, so
they do not depend on the CPU's newer instructions either). Its metrics.jsonl is compared with the file at a
relative tolerance of 5e-5 (absolute 1e-8, for the terms that are zero up to rounding, as an on-policy ratio loss):
repeated runs on one machine are bit-identical; two x86 CPUs differ by up to 1e-5 on the RL presets (rewards,
advantages and two optimizer steps amplify the last bit), an AVX2-only AMD EPYC with torch's CUDA build by up to
3.5e-5 (Diffusion-DPO's grad norm at step 2), and a real change moves the values by more (a loss scaled by 1.0001
moves every NFT value by 1e-4). `-k sft` runs only the presets it selects.

A change that is meant to move the numbers (a new sampler grid, a fixed loss) refreshes the file deliberately:

    SANARL_REFRESH_GOLDEN=1 bash scripts/test.sh tests/integration/test_golden_steps.py

rewrites tests/data/golden_steps.json from the runs (the tests then pass); review its diff with the change. The
file records, per preset, the exact command that produced its values.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_steps.json"
REFRESH = "SANARL_REFRESH_GOLDEN=1 bash scripts/test.sh tests/integration/test_golden_steps.py"
PLUGIN = "sanarl.datasets.shapes"
OUT = "OUT"
"""Stands for the run's output folder in the recorded commands."""
REL_TOL = 5e-5
ABS_TOL = 1e-8
ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",
}

SHORT = ("train.max_num_steps=2", "validation.enable=false", "validation.val_before_train=false",
         "train.ckpt.enable_checkpoint=false", "train.ckpt.export_safetensors=false",
         "logging.multi_modal_log_interval=0")  # fmt: skip
RL_BATCH = ("rollout.n_generation=4", "rollout.batch_size=8", "train.train_batch_per_replica=8",
            "train.train_policy.mini_batch=8")  # fmt: skip
RUNS: dict[str, tuple[str, ...]] = {
    "tiny-shapes-sft": ("train.train_batch_per_replica=8", "train.train_policy.mini_batch=8"),
    "tiny-shapes-nft": RL_BATCH,
    "tiny-shapes-nft-solrl": (*RL_BATCH, "rollout.num_candidates=8"),
    "tiny-shapes-grpo": RL_BATCH,
    "tiny-shapes-ddrl": RL_BATCH,
    "tiny-shapes-awm": RL_BATCH,
    "tiny-shapes-grpo-guard": RL_BATCH,
    "tiny-shapes-mixgrpo": RL_BATCH,
    "tiny-shapes-soar": ("train.train_batch_per_replica=4", "train.train_policy.mini_batch=4"),
    "tiny-video-sft": ("train.train_batch_per_replica=4", "train.train_policy.mini_batch=4"),
    "tiny-shapes-dpo": ("train.train_batch_per_replica=8", "train.train_policy.mini_batch=4"),
    "tiny-shapes-dpo-online": RL_BATCH,
}
"""Preset -> its --set values (besides SHORT and the output folder)."""
REWARDED = {
    "tiny-shapes-nft",
    "tiny-shapes-nft-solrl",
    "tiny-shapes-grpo",
    "tiny-shapes-ddrl",
    "tiny-shapes-awm",
}
REWARDED |= {"tiny-shapes-grpo-guard"}
REWARDED |= {"tiny-shapes-mixgrpo"}
"""The methods that score rollouts with a reward (SFT and SOAR train on data alone)."""
REWARDED |= {"tiny-shapes-dpo-online"}
PLUGINS = {"tiny-shapes-dpo": "sanarl.datasets.shapes_pairs"}
"""Presets whose golden run reads another plugin than PLUGIN (offline DPO trains on preference pairs)."""
KEYS = ("loss", "grad_norm", "reward/mean")
"""Pinned per step where the method logs them, with every loss term it logs (`*_loss`: policy, KL, data;
`loss_*`: SOAR's main and auxiliary terms)."""


def command(preset: str) -> list[str]:
    """The CLI arguments of a golden run, with OUT for its output folder."""
    sets = [f"train.output_dir={OUT}", *SHORT, *RUNS[preset]]
    plugin = PLUGINS.get(preset, PLUGIN)
    return ["-m", "sanarl", "--config", preset, plugin, *(arg for s in sets for arg in ("--set", s))]


def pinned(record: dict) -> dict[str, float]:
    """The values of one metrics.jsonl record that the file pins."""
    keys = [k for k in record if k in KEYS or k.endswith("_loss") or k.startswith("loss_")]
    return {k: record[k] for k in sorted(keys)}


def run_preset(preset: str, scratch: Path) -> list[dict]:
    """Run one golden command in its own folder; the pinned values of each logged step."""
    out = scratch / preset
    out.mkdir(parents=True)
    args = [a.replace(f"={OUT}", f"={out}") for a in command(preset)]
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=out, env=env
    )
    assert done.returncode == 0, f"{preset} failed:\n{done.stderr[-4000:]}"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], **pinned(r)} for r in records]


def golden_document(runs: dict[str, list[dict]]) -> dict:
    """The file's content: how to refresh it, the run settings, and per preset its command and steps."""
    return {
        "refresh": REFRESH,
        "env": ENV,
        "torch": torch.__version__,
        "presets": {
            p: {"command": shlex.join(["python", *command(p)]), "steps": runs[p]} for p in sorted(runs)
        },
    }


def selected_presets(session: pytest.Session) -> list[str]:
    """The presets whose golden test this session runs (`-k sft` runs only those), in RUNS' order."""
    chosen = set()
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if (
            getattr(item, "module", None) is sys.modules[__name__]
            and callspec
            and "preset" in callspec.params
        ):
            chosen.add(callspec.params["preset"])
    return [p for p in RUNS if p in chosen]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, list[dict]]:
    """The golden runs, side by side (one thread each); with SANARL_REFRESH_GOLDEN=1 all of them run and rewrite
    the file."""
    refresh = os.environ.get("SANARL_REFRESH_GOLDEN") == "1"
    presets = list(RUNS) if refresh else selected_presets(request.session)
    scratch = tmp_path_factory.mktemp("golden")
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = dict(zip(presets, pool.map(lambda p: run_preset(p, scratch), presets), strict=True))
    if refresh:
        GOLDEN.write_text(json.dumps(golden_document(results), indent=1, sort_keys=True) + "\n")
    return results


@pytest.fixture(scope="module")
def golden(request) -> dict:
    """The file's content (with SANARL_REFRESH_GOLDEN=1, as the runs rewrote it)."""
    if os.environ.get("SANARL_REFRESH_GOLDEN") == "1":
        request.getfixturevalue("runs")
    if not GOLDEN.is_file():
        pytest.fail(f"{GOLDEN.relative_to(ROOT)} is missing; create it with `{REFRESH}`")
    return json.loads(GOLDEN.read_text())


def mismatches(preset: str, expected: list[dict], got: list[dict]) -> list[str]:
    """One line per differing value: preset, step, key, expected, got."""
    lines = []
    if [e["step"] for e in expected] != [g["step"] for g in got]:
        lines.append(
            f"{preset}: logged steps {[g['step'] for g in got]}, recorded {[e['step'] for e in expected]}"
        )
    for e, g in zip(expected, got, strict=False):  # a length difference is reported above
        for key in sorted(set(e) | set(g)):
            want, have = e.get(key), g.get(key)
            if want is None or have is None:
                lines.append(f"{preset} step {e['step']} {key}: expected {want!r}, got {have!r}")
            elif not math.isclose(want, have, rel_tol=REL_TOL, abs_tol=ABS_TOL):
                lines.append(
                    f"{preset} step {e['step']} {key}: expected {want!r}, got {have!r} "
                    f"(relative difference {abs(have - want) / max(abs(want), ABS_TOL):.3g})"
                )
    return lines


def test_the_file_records_every_preset_with_its_current_command(golden):
    doc = golden
    assert sorted(doc["presets"]) == sorted(RUNS), f"presets changed: refresh with `{REFRESH}`"
    for preset, entry in doc["presets"].items():
        assert entry["command"] == shlex.join(["python", *command(preset)]), (
            f"{preset}: the recorded command differs from RUNS; refresh with `{REFRESH}`"
        )
    assert doc["env"] == ENV and doc["refresh"] == REFRESH


@pytest.mark.parametrize("preset", list(RUNS))
def test_first_steps_log_the_golden_values(preset, runs, golden):
    doc = golden
    expected = doc["presets"].get(preset, {}).get("steps", [])
    lines = mismatches(preset, expected, runs[preset])
    note = "" if doc.get("torch") == torch.__version__ else f" (recorded with torch {doc.get('torch')})"
    assert not lines, (
        f"first steps differ from {GOLDEN.relative_to(ROOT)}{note}:\n"
        + "\n".join(lines)
        + f"\nIf the change is meant to move these numbers, refresh the file with `{REFRESH}` and review its diff."
    )
    wanted = {"loss", "grad_norm"} | ({"reward/mean"} if preset in REWARDED else set())
    assert [r["step"] for r in runs[preset]] == [1, 2] and all(wanted <= set(r) for r in runs[preset])
