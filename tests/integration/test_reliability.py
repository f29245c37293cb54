"""Faults during a run and damaged state between runs, reproduced through the CLI (docs/reliability.md): kill -9
inside a checkpoint overwrite, a rewind then a crash, damaged checkpoint files, a resume with another config, two
runs into one folder, a damaged metrics.jsonl, SIGTERM / SIGINT, divergence, a full disk."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sanarl.training.run_folder.checkpoint_store import list_checkpoints

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
import sanarl.training.run_folder.checkpoint_store as checkpoint
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


# --- 2. a rewind, then a crash ------------------------------------------------------------------------------------
def test_a_rewind_killed_midway_resumes_on_its_own_timeline(tmp_path, cli):
    """12 steps (checkpoints 2..12), a rewind to step 4 with another seed killed at step 9, then `resume = true`:
    the resume continues the rewind from its step 8, not the old timeline's step 12 (the old code's rotation had
    deleted the rewind's 6 and 8 and kept the old 10 and 12)."""
    run = tmp_path / "run"
    proc = start(args(run, 12))
    assert proc.wait(timeout=600) == 0, proc.communicate()[1].decode()[-3000:]
    ckpts = run / "checkpoints"
    rewind = args(run, 12, f"train.resume={ckpts / STEP(4)}", "train.seed=7", "train.ckpt.max_keep=2")
    kill9(paused(rewind, "step_9", tmp_path))
    assert steps_of(run) == [6, 8]  # the old 6..12 left rotation when the rewind started
    (moved,) = (ckpts / "retired").iterdir()
    assert moved.name.startswith("abandoned-")
    assert sorted(p.name for p in moved.iterdir()) == [STEP(s) for s in (6, 8, 10, 12)]
    code, out, err = cli(*args(run, 12, "train.seed=7", "train.ckpt.max_keep=2"))
    assert code == 0, err
    assert f"resumedfrom{ckpts}/{STEP(8)}atstep8" in flat(out + err)
    assert steps_of(run) == [10, 12]
    meta = json.loads((ckpts / STEP(12) / "meta.json").read_text())
    assert meta["config"]["train"]["seed"] == 7


# --- 7. SIGTERM and SIGINT ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_writes_a_final_checkpoint_and_exits_with_its_code(tmp_path, cli, sig):
    """The signal lands mid-run (after step 2 is logged); the run finishes its step, writes that step's
    checkpoint and exits 128 + signal. Leftovers of a kill (a staging folder, an empty step folder) are cleaned
    at the next start, which resumes from the signal's checkpoint."""
    run = tmp_path / "run"
    proc = start(args(run, 1000, "train.ckpt.save_freq=1000"))
    metrics, deadline = run / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1].decode()[-3000:]
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    text = flat(err.decode())
    assert proc.returncode == 128 + sig, text[-3000:]
    assert f"{sig.name}received:stoppingafterthisstepwithacheckpoint" in text  # written by the handler itself
    match = re.search(rf"{sig.name}atstep(\d+):checkpointwritten", text)
    assert match, text[-3000:]
    step = int(match.group(1))
    assert steps_of(run) == [step] and step >= 2
    ckpts = run / "checkpoints"
    assert not list(ckpts.glob(".staging-*"))
    if sig == signal.SIGTERM:
        (ckpts / ".staging-leftover").mkdir()
        (ckpts / STEP(999)).mkdir()
        code, out, err = cli(*args(run, step + 1, "train.ckpt.save_freq=1000"))
        assert code == 0, err
        assert f"resumedfrom{ckpts}/{STEP(step)}atstep{step}" in flat(out + err)
        assert sorted(p.name for p in ckpts.iterdir()) == [STEP(step), STEP(step + 1)]


# --- 4. one run per folder ----------------------------------------------------------------------------------------
def test_a_second_run_into_a_folder_in_use_exits_2_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    first = paused(args(run, 100), "step_1", tmp_path)
    try:
        second = start(args(run, 2))
        _, err = second.communicate(timeout=300)
        text = flat(err.decode())
        assert second.returncode == 2, text[-3000:]
        assert f"isinusebyanotherrun(pidandhost:{first.pid}" in text and "train.output_dir" in text
        assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    finally:
        kill9(first)
    proc = start(args(run, 2))  # the kernel dropped the dead holder's lock
    assert proc.wait(timeout=600) == 0, proc.communicate()[1].decode()[-3000:]


# --- 5. metrics.jsonl ---------------------------------------------------------------------------------------------
def test_a_kill_mid_rewrite_or_damaged_lines_in_metrics_jsonl_never_block_a_resume(run_copy, cli, tmp_path):
    metrics = run_copy / "metrics.jsonl"
    before = metrics.read_bytes()
    shutil.rmtree(
        run_copy / "checkpoints" / STEP(4)
    )  # the resume at step 2 rewrites metrics.jsonl (drops 3, 4)
    kill9(paused(args(run_copy, 4), "metrics_rewrite", tmp_path))
    assert metrics.read_bytes() == before  # the old file stays whole until the new one replaces it
    lines = before.splitlines()
    damaged = [lines[0], b'{"step": 2, "loss": 0.', b"\xff\xfe not utf-8", b"[" * 100_000, *lines[1:]]
    metrics.write_bytes(b"\n".join(damaged) + b"\n")
    code, out, err = cli(*args(run_copy, 4))
    assert code == 0, err
    assert f"{metrics}:droppedunreadableline(s)2,3,4" in flat(out + err)
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2, 3, 4]
    assert not list(run_copy.glob(".metrics.jsonl.*"))


# --- 3. a resume with another config ------------------------------------------------------------------------------
def test_a_resume_refuses_changed_recipe_keys_and_records_the_allowed_ones(run_copy, cli):
    config = (run_copy / "config.toml").read_text()
    code, _, err = cli(*args(run_copy, 6, "train.optm_lr=5e-4", "train.train_batch_per_replica=16"))
    assert code == 2 and "Traceback" not in err
    text = flat(err)
    assert "`train.optm_lr`0.001->0.0005" in text and "`train.train_batch_per_replica`8->16" in text
    assert "train.output_dir" in text and "train.resume=false" in text
    other = ["--config", str(PRESET), "sanarl.datasets.shapes", *args(run_copy, 6)[3:]]
    code, _, err = cli(*other)
    assert code == 2 and f"`plugin`'{Path(SQUARES).resolve()}'->'sanarl.datasets.shapes'" in flat(err)
    assert (run_copy / "config.toml").read_text() == config and steps_of(run_copy) == [2, 4]
    code, out, err = cli(*args(run_copy, 6, "logging.log_freq=2"))
    assert code == 0, err
    assert "resumechanges`train.max_num_steps`:4->6" in flat(err)
    assert "max_num_steps = 6" in (run_copy / "config.toml").read_text()
    (record,) = [json.loads(x) for x in (run_copy / "resumes.jsonl").read_text().splitlines()]
    record["changed"].pop("train.output_dir")  # the run was copied
    assert record["step"] == 4 and record["changed"] == {
        "logging.log_freq": {"old": 1, "new": 2},
        "train.max_num_steps": {"old": 4, "new": 6},
    }


# --- 8. divergence ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lr", ["inf", "nan", "1e30", "-1"])
def test_validate_refuses_a_non_finite_or_absurd_learning_rate(cli, tmp_path, lr):
    code, _, err = cli("validate", *args(tmp_path / "run", 4, f"train.optm_lr={lr}"))
    assert code == 2 and "`train.optm_lr`" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_diverging_run_stops_with_exit_3_before_any_checkpoint_or_export_holds_it(tmp_path, cli):
    """SGD at lr 1 without clipping diverges within a few steps on the tiny model: the run stops with exit code 3
    naming the step and the likely cause; every checkpoint left holds finite weights and nothing is exported."""
    run = tmp_path / "run"
    sets = ("train.optm_name=SGD", "train.optm_lr=1", "train.optm_grad_norm_clip=0")
    code, _, err = cli(*args(run, 50, *sets, "train.ema_enable=false", "train.ckpt.export_safetensors=true"))
    assert code == 3, err
    assert "trainingdivergedatstep" in flat(err) and "train.optm_lr" in err
    assert not (run / "export").exists()
    for ckpt in list_checkpoints(run / "checkpoints"):
        assert all(torch.isfinite(t).all() for t in load_file(str(ckpt / "model.safetensors")).values())


# --- 11. a full disk; file modes ----------------------------------------------------------------------------------
def test_a_full_disk_at_a_checkpoint_is_exit_2_and_leaves_no_staging_folder(run_copy, cli, monkeypatch):
    monkeypatch.setenv("SANARL_TEST_FAIL_AT", "checkpoint_write")
    code, _, err = cli(*args(run_copy, 6))
    assert code == 2 and "Traceback" not in err
    assert f"diskfullat{run_copy}/checkpoints" in flat(err)
    ckpts = run_copy / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [STEP(2), STEP(4)]


def test_exported_weights_get_the_umask_modes_of_config_toml(run_copy, cli):
    code, _, err = cli(*args(run_copy, 6, "train.ckpt.export_safetensors=true"))
    assert code == 0, err
    mode = stat.S_IMODE((run_copy / "config.toml").stat().st_mode)
    files = [p for p in (run_copy / "export").rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files)
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {mode}
    newest = run_copy / "checkpoints" / STEP(6)
    assert {stat.S_IMODE(p.stat().st_mode) for p in newest.iterdir()} == {mode}


# --- 11. inputs validate must refuse --------------------------------------------------------------------------------
def _diffusers_folder(tmp_path: Path, json_bytes: bytes) -> Path:
    from PIL import Image

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.json").write_bytes(json_bytes)
    Image.new("RGB", (8, 8), (255, 0, 0)).save(folder / "a.png")
    return folder


@pytest.mark.parametrize(
    ("sets", "expect"),
    [
        (["train.seed=99999999999999999999"], "`train.seed`=99999999999999999999isoutofrange"),
        (["train.seed=-1"], "`train.seed`=-1isoutofrange"),
        (["policy.model_name_or_path=sanarl-tiny:nope"], "unknowntinymodel`sanarl-tiny:nope`"),
        (["train.output_dir={tmp}/" + "n" * 300], "`train.output_dir`istoolong"),
        (["train.output_dir={tmp}/afile/run"], "isnotadirectory"),
        (
            ["train.train_policy.remote_reward.reward_fns=[{name='shapes', weight=nan}]"],
            "reward_fns[0].weight`=nanmustbeafinitenumber",
        ),
    ],
    ids=["seed_overflow", "seed_negative", "unknown_tiny", "name_too_long", "parent_is_a_file", "weight_nan"],
)
def test_validate_refuses_bad_run_inputs(cli, tmp_path, sets, expect):
    (tmp_path / "afile").write_text("x")
    preset = "tiny-shapes-nft" if "reward_fns" in sets[0] else str(PRESET)
    argv = ["validate", "--config", preset, "sanarl.datasets.shapes"]
    argv += [x for s in sets for x in ("--set", s.replace("{tmp}", str(tmp_path)))]
    code, out, err = cli(*argv)
    assert code == 2 and "Traceback" not in err, out + err
    assert expect in flat(err)


@pytest.mark.parametrize(
    ("content", "expect"),
    [(b'{"prompt": "caf\xe9"}', "codeccan'tdecode"), (b"[" * 100_000, "maximumrecursiondepth")],
    ids=["not_utf8", "nested_100k"],
)
def test_validate_names_a_dataset_json_it_cannot_read(cli, tmp_path, content, expect):
    folder = _diffusers_folder(tmp_path, content)
    argv = ["validate", "--config", str(PRESET), "sanarl.datasets.diffusers_dataset"]
    code, _, err = cli(*argv, "--set", f"train.train_policy.dataset.local_dir={folder}")
    assert code == 2 and "Traceback" not in err, err
    assert flat(f"Malformed JSON in '{folder / 'a.json'}'") in flat(err) and expect in flat(err)


def test_lora_target_modules_that_match_nothing_stop_the_run_with_exit_2_naming_real_layers(cli, tmp_path):
    run = tmp_path / "run"
    code, _, err = cli(
        *args(run, 2, "policy.lora={r=2, lora_alpha=2.0, target_modules=['to_qq']}", "train.ema_enable=false")
    )
    assert code == 2 and "Traceback" not in err, err
    assert "`policy.lora.target_modules`entries['to_qq']matchnolayer" in flat(err) and "attn1.to_q" in err
