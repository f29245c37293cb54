"""The CLI's messages as a user meets them (`python -m sanarl ...` in a subprocess): Typer's own usage errors are
one `error:` line with exit code 2 like sanarl's, the help names its placeholders (PRESET, PLUGIN, KEY=VALUE),
every flag has one spelling and a help text, the eval split typo names the flag that fixes it, and `validate`
does not claim HF_HUB_OFFLINE is set when it is not and refuses a score_key the reward does not return."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def sanarl(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200", **env}
    for name in [k for k, v in env.items() if v == ""]:
        environment.pop(name)
    cmd = [sys.executable, "-m", "sanarl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environment, cwd=cwd)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--config", "tiny-shapes-sft"], "error: Missing argument 'PLUGIN'. (`sanarl --help`)"),
        (["--config", "tiny-shapes-sft", "sanarl.datasets.shapes", "--bogus"],
         "error: No such option: --bogus (`sanarl --help`)"),
        (["validate", "--config", "tiny-shapes-sft"], "error: Missing argument 'PLUGIN'. (`sanarl validate --help`)"),
        (["eval", "--frob"], "error: No such option: --frob (`sanarl eval --help`)"),
    ],
    ids=["missing-plugin", "unknown-option", "validate-missing-plugin", "eval-unknown-option"],
)  # fmt: skip
def test_usage_errors_are_one_line_with_exit_2(args, line, tmp_path):
    done = sanarl(tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [line], done.stderr
    assert "╭" not in done.stderr + done.stdout  # no boxed panel


def test_help_names_placeholders_and_single_spelling_flags(tmp_path):
    train = sanarl(tmp_path, "train", "--help").stdout
    assert "Usage: sanarl [OPTIONS] PLUGIN" in train and "{" not in train
    assert "PRESET" in train and "KEY=VALUE" in train and "list[str]" not in train
    assert "--no-dry-run" not in train
    assert "stop before the first training step" in " ".join(train.replace("│", " ").split())
    evaluation = sanarl(tmp_path, "eval", "--help").stdout
    assert (
        "--no-ema" in evaluation and "--no-no-ema" not in evaluation and "--no-image-stats" not in evaluation
    )
    validate = sanarl(tmp_path, "validate", "--help").stdout
    assert "--no-fsdp" not in validate and "--no-memory" not in validate and "{" not in validate


def test_an_eval_split_typo_names_the_dataset_flag(tmp_path):
    done = sanarl(tmp_path, "eval", "--model", "sanarl-tiny:shapes-base", "--dataset", "shapes:tset",
                  "--rewards", "shapes", "--output", str(tmp_path / "eval"))  # fmt: skip
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert "'tset', which the shapes world does not have" in said
    assert "e.g. `--dataset shapes:test`" in said and "--set" not in said


def test_validate_does_not_claim_hf_hub_offline_when_it_is_not_set(tmp_path):
    done = sanarl(
        tmp_path, "validate", "--config", "tiny-shapes-nft", "sanarl.datasets.shapes",
        "--set", 'validation.held_out_rewards=["aesthetic"]',
        HF_HUB_OFFLINE="", HF_HOME=str(tmp_path / "empty-hf"), SANARL_REWARD_CKPTS=str(tmp_path / "none"),
    )  # fmt: skip
    said = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stderr
    assert (
        "warning: reward 'aesthetic': weights not found on this machine, so the run downloads Hub ids" in said
    )
    assert "this check does not download" in said and "HF_HUB_OFFLINE is set" not in said


@pytest.mark.parametrize(
    ("preset", "typo", "available"),
    [("tiny-shapes-nft", "exact_partal", "'exact_partial'"),
     ("tiny-video-nft", "direction_exakt", "'direction_exact'")],
)  # fmt: skip
def test_validate_refuses_a_score_key_the_reward_does_not_return(tmp_path, preset, typo, available):
    """`validate` says what training says (exit 2, the entry, the key and the keys the reward returns) for a
    score_key typo; it used to print "valid" and leave the refusal to the run."""
    key = "train.train_policy.remote_reward.reward_fns.0.score_key"
    done = sanarl(
        tmp_path, "validate", "--config", preset, "sanarl.datasets.shapes", "--set", f"{key}={typo}"
    )
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout
    assert "reward_fns[0]` (name = " in said and f"has score_key = {typo!r}" in said
    assert "available keys: [" in said and available in said
    assert "valid" not in done.stdout


def test_docs_plugins_md_a_module_in_the_current_directory_needs_a_path_or_pythonpath(tmp_path):
    """docs/plugins.md: the `sanarl` program does not search the current directory; `./my_data.py` or
    PYTHONPATH=. finds the module there."""
    import shutil

    (tmp_path / "my_data.py").write_text(
        "from sanarl.datasets.shapes import get_dataset, get_val_dataset  # noqa\n"
    )
    program = shutil.which("sanarl")
    assert program, "the sanarl entry point is not installed"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": root, "COLUMNS": "200"}

    def validate(plugin: str, **extra: str) -> subprocess.CompletedProcess:
        cmd = [program, "validate", "--config", "tiny-shapes-sft", plugin]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, env={**env, **extra}, cwd=tmp_path
        )

    dotted = validate("my_data")
    assert dotted.returncode == 2 and "pass it as `./my_data.py`" in " ".join(dotted.stderr.split())
    assert validate("./my_data.py").returncode == 0
    assert validate("my_data", PYTHONPATH=os.pathsep.join([".", root])).returncode == 0


def test_a_command_group_alone_prints_its_help_and_no_error_line(tmp_path):
    done = sanarl(tmp_path, "bench")
    assert "Usage: sanarl bench" in done.stdout and "shapes" in done.stdout
    assert "error:" not in done.stderr and done.returncode == 2  # click's code for a group given no command
