"""The second fault audit of docs/reliability.md, reproduced through the CLI: a shorter re-run into the folder of a
longer one, `validate` against what `train` refuses, a full disk during the export and a resume, kill -9 inside a
re-export and inside rotation, planted symlinks, secrets in the run's files, silent checkpoint damage, SIGINT
during the export, deep TOML and byte-identical LoRA exports."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import ROOT, STEP, args, flat, start, steps_of

pytestmark = pytest.mark.slow


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links not followed) -> its sha256; folders -> "dir". The lock file is left out
    (each run writes its pid into it)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if rel == ".lock":
            continue
        if path.is_symlink():
            found[rel] = "link -> " + os.readlink(path)
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


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


# --- 1. a shorter re-run never rewrites history --------------------------------------------------------------------
def test_a_shorter_rerun_is_exit_2_naming_the_checkpoint_step_and_writes_nothing(run_copy, cli):
    """The finished 4-step run re-run with `train.max_num_steps = 2` (its preset says `resume = true`): the old code
    resumed at step 4, trained nothing and wrote step 4's weights into step 2's checkpoint and the export."""
    before = snapshot(run_copy)
    code, out, err = cli(*args(run_copy, 2, "train.ckpt.export_safetensors=true"))
    assert code == 2 and "Traceback" not in err, err
    text = flat(err)
    assert (
        f"{run_copy}/checkpoints/{STEP(4)}isatstep4,pastthe2stepsthisrunplans(train.max_num_steps=2)" in text
    )
    assert (
        "`train.max_num_steps`toatleast4" in text
        and "train.output_dir" in text
        and "train.resume=false" in text
    )
    assert flat(f'train.resume = "{run_copy / "checkpoints" / STEP(2)}"') in text  # the rewind that fits
    assert "done:" not in out
    assert snapshot(run_copy) == before


def _docs_tensorboard_command() -> list[str]:
    """docs/logging.md's TensorBoard run, as typed."""
    text = (ROOT / "docs" / "logging.md").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("sanarl --config") and "tensorboard" in x]
    return shlex.split(line)


def test_the_docs_tensorboard_run_after_the_readme_run_trains_in_its_own_folder(tmp_path):
    """The README's first run (cut short here at 21 steps), then docs/logging.md's TensorBoard command in the same
    folder: it trains its 20 steps into its own output folder and logs scalars; the same command into the README
    run's folder (as the docs had it) stops with exit 2 naming step 21 and writes nothing."""
    env = {**os.environ, "COLUMNS": "300"}

    def sanarl(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "sanarl", *argv]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)

    first = sanarl("--config", "tiny-shapes-sft", "sanarl.datasets.shapes", "--set", "train.max_num_steps=21")
    assert first.returncode == 0, first.stderr[-3000:]
    readme_run = tmp_path / "outputs" / "tiny-shapes-sft"
    before = snapshot(readme_run)
    argv = _docs_tensorboard_command()[1:]
    second = sanarl(*argv)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done: 20 steps" in second.stdout
    events = list((tmp_path / "outputs" / "tiny-shapes-sft-tensorboard" / "tensorboard").rglob("events.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(events[0].parent)).Reload().Tags()["scalars"]
    assert "loss" in scalars
    assert snapshot(readme_run) == before
    own = argv.index(next(a for a in argv if a.startswith("train.output_dir=")))
    old_docs = argv[: own - 1] + argv[own + 1 :]  # without its own output folder
    third = sanarl(*old_docs)
    assert third.returncode == 2, third.stderr[-3000:]
    assert f"{STEP(21)}isatstep21,pastthe20steps" in flat(third.stderr)
    assert snapshot(readme_run) == before


# --- 2. validate refuses what train refuses or crashes on ------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "sets", "expect"),
    [
        (
            "tiny-shapes-sft",
            ["policy.diffusers.inference_size=[20000,20000]"],
            "GiBperrank(training)butthismachine",
        ),
        ("tiny-shapes-nft", ["rollout.num_candidates=-1"], "`rollout.num_candidates`=-1isoutofrange"),
        ("tiny-shapes-sft", ["train.resume={tmp}/nothing-here"], "holdsnocheckpoint"),
        (
            "tiny-shapes-nft",
            ["policy.diffusers.sample.num_steps=100000000"],
            "sample.num_steps`=100000000isoutofrange",
        ),
    ],
    ids=["inference_size_20000", "num_candidates_negative", "resume_no_checkpoint", "sample_steps_1e8"],
)
def test_validate_refuses_what_train_refuses_before_touching_data(
    cli, tmp_path, monkeypatch, preset, sets, expect
):
    """Each of these used to pass `sanarl validate` (the oversized one was OOM-killed rendering dataset item 0 at
    full size) and then stop `sanarl train` with a traceback or the memory plan. The plugin's dataset is never
    built: validate refuses from the config alone."""
    import sanarl.datasets.shapes as shapes

    monkeypatch.setattr(shapes, "get_dataset", lambda cfg: pytest.fail("validate built the dataset"))
    run = tmp_path / "run"
    sets = [s.replace("{tmp}", str(tmp_path)) for s in [*sets, f"train.output_dir={run}"]]
    for command in (["validate"], []):
        code, out, err = cli(
            *command, "--config", preset, "sanarl.datasets.shapes", *[x for s in sets for x in ("--set", s)]
        )
        assert code == 2 and "Traceback" not in err, out + err
        assert expect in flat(err)
        assert not run.exists()


def test_validate_refuses_a_resume_past_max_num_steps(run_copy, cli):
    code, _, err = cli("validate", *args(run_copy, 2))
    assert code == 2 and "Traceback" not in err, err
    assert f"{STEP(4)}isatstep4,pastthe2stepsthisrunplans" in flat(err)
