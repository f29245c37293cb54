"""Faults during a run and damaged state between runs, reproduced through the CLI (docs/reliability.md): kill -9
inside a checkpoint overwrite, a rewind then a crash, damaged checkpoint files, a resume with another config, two
runs into one folder, a damaged metrics.jsonl, SIGTERM / SIGINT, divergence, a full disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sanarl.training.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml"
SQUARES = str(ROOT / "tests" / "data" / "plugins" / "squares.py")
STEP = "step_{:08d}".format


def args(out: Path, steps: int, *sets: str) -> list[str]:
    """`sanarl` argv of a tiny SFT run (EMA on, a checkpoint every 2 steps, all kept, `train.resume = true`)."""
    base = [
        f"train.output_dir={out}",
        f"train.max_num_steps={steps}",
        "train.epoch=1000",
        "train.train_batch_per_replica=8",
        "train.train_policy.mini_batch=8",
        "train.optm_warmup_steps=0",
        "train.ckpt.save_freq=2",
        "train.ckpt.max_keep=0",
        "train.ckpt.export_safetensors=false",
        "validation.enable=false",
        "logging.log_freq=1",
    ]
    return ["--config", str(PRESET), SQUARES, *[x for s in (*base, *sets) for x in ("--set", s)]]


def flat(text: str) -> str:
    """Console text without line folds or spaces (rich folds long paths)."""
    return "".join(text.split())


def steps_of(run: Path) -> list[int]:
    return [int(p.name[5:]) for p in list_checkpoints(run / "checkpoints")]


def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sanarl", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "300", **(env or {})},
        cwd=ROOT,
    )


def paused(argv: list[str], point: str, tmp_path: Path) -> subprocess.Popen:
    """A CLI run stopped at fault point `point` (sanarl/training/faults.py), still alive."""
    marker = tmp_path / f"paused-{point}"
    proc = start(argv, {"SANARL_TEST_PAUSE_AT": point, "SANARL_TEST_PAUSE_FILE": str(marker)})
    deadline = time.time() + 300
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        assert time.time() < deadline, "the run never reached the pause point"
        time.sleep(0.2)
    return proc


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A finished 4-step run: checkpoints at steps 2 and 4 (with EMA), metrics of steps 1-4."""
    out = tmp_path_factory.mktemp("base") / "run"
    proc = start(args(out, 4))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert steps_of(out) == [2, 4]
    return out


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(base_run, target)
    return target


@pytest.fixture
def cli(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    return run_cli


# --- 1. a checkpoint overwrite killed between its two renames -----------------------------------------------------
KILL_AT_SWAP = """
import os, signal, sys
import sanarl.training.checkpoint as checkpoint
real = os.replace
def replace(src, dst):
    if os.path.basename(str(src)).startswith(".staging-") and os.path.basename(str(dst)) == "{name}":
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 as the new checkpoint is about to take its place
    return real(src, dst)
checkpoint.os.replace = replace
from sanarl.cli import main
sys.argv = ["sanarl", *sys.argv[1:]]
main()
"""


def test_a_kill_inside_a_checkpoint_overwrite_resumes_from_the_intact_checkpoint(run_copy, cli):
    """max_keep = 1 and a re-run of the finished run (it resumes at step 4 and rewrites step 4's checkpoint):
    kill -9 between moving the old checkpoint out and the new one in. The next run resumes from step 4 (the old
    code had deleted it first: the run silently restarted from step 0)."""
    shutil.rmtree(run_copy / "checkpoints" / STEP(2))
    argv = args(run_copy, 4, "train.ckpt.max_keep=1")
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AT_SWAP.format(name=STEP(4)), *argv], capture_output=True, cwd=ROOT
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    code, out, err = cli(*argv)
    assert code == 0, err
    assert f"resumedfrom{run_copy}/checkpoints/{STEP(4)}atstep4" in flat(out + err)
    assert steps_of(run_copy) == [4]
    assert [p.name for p in (run_copy / "checkpoints").iterdir() if p.name.startswith(".")] == []
    assert [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]


# --- 6. damaged checkpoint files ----------------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_64_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def _other_shapes(path: Path) -> None:
    save_file({k: torch.zeros(3) for k in load_file(str(path))}, str(path))


def _meta(update):
    def damage(path: Path) -> None:
        meta = json.loads(path.read_text())
        update(meta)
        path.write_text(json.dumps(meta))

    return damage


DAMAGE = {
    "state_truncated": ("state.pt", _truncate),
    "state_random": ("state.pt", lambda p: p.write_bytes(os.urandom(4096))),
    "state_empty": ("state.pt", lambda p: p.write_bytes(b"")),
    "state_missing": ("state.pt", Path.unlink),
    "model_truncated": ("model.safetensors", _truncate),
    "model_64_flipped_bytes": ("model.safetensors", _flip_64_bytes),
    "model_other_shapes": ("model.safetensors", _other_shapes),
    "model_missing": ("model.safetensors", Path.unlink),
    "ema_truncated": ("ema.safetensors", _truncate),
    "ema_missing": ("ema.safetensors", Path.unlink),
    "meta_garbage": ("meta.json", lambda p: p.write_bytes(b"\xff{garbage")),
    "meta_without_step": ("meta.json", _meta(lambda m: m.pop("step"))),
    "meta_negative_step": ("meta.json", _meta(lambda m: m.update(step=-4))),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(run_copy, cli, kind):
    name, damage = DAMAGE[kind]
    newest = run_copy / "checkpoints" / STEP(4)
    damage(newest / name)
    code, out, err = cli(*args(run_copy, 3))
    assert code == 0, err
    text = flat(out + err)
    assert f"{STEP(4)}isdamaged" in text and flat(name) in text
    assert f"resumedfrom{run_copy}/checkpoints/{STEP(2)}atstep2" in text
    assert steps_of(run_copy) == [2, 3]
    (retired,) = (run_copy / "checkpoints" / "retired").iterdir()
    assert retired.name.startswith("damaged-") and (retired / STEP(4)).is_dir()


def test_a_damaged_checkpoint_named_by_path_or_no_intact_one_is_exit_2_naming_the_file(run_copy, cli):
    ckpts = run_copy / "checkpoints"
    _flip_64_bytes(ckpts / STEP(4) / "model.safetensors")
    code, out, err = cli(*args(run_copy, 6, f"train.resume={ckpts / STEP(4)}"))
    assert code == 2 and "Traceback" not in err
    assert flat(f"cannot resume from {ckpts / STEP(4)}") in flat(err) and "train.resume=false" in flat(err)
    (ckpts / STEP(2) / "state.pt").write_bytes(b"")
    code, out, err = cli(*args(run_copy, 6))
    assert code == 2 and "Traceback" not in err
    assert "nointactcheckpoint" in flat(err) and flat(str(ckpts / STEP(2) / "state.pt")) in flat(err)
    assert steps_of(run_copy) == [2, 4]  # nothing moved, nothing written
