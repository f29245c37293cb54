"""Hints on the paths a user tries first: a misspelt command, preset name, `presets --copy` name or config key
gets a "did you mean" naming the right one (exit 2), and the plan's `steps` row says what ends the run
(`train.max_num_steps` only caps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ("--config", "tiny-shapes-sft", "sanarl.datasets.shapes")


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps at the terminal width


def test_a_misspelt_command_is_named_with_the_right_one(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "sanarl", "trian", *SHAPES]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown command 'trian' (did you mean 'train'?)" in flat(done.stderr)


def test_a_plugin_named_first_is_still_a_training_run_argument(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `shapes` is close to no command: read as the plugin, as before
    code, _, err = run_cli("tran", "--config", "tiny-shapes-sft")
    assert code == 2 and "did you mean 'train'" in flat(err)
    code, _, err = run_cli("sanarl.datasets.shapes", "--config", "tiny-shapes-sft", "--dry-run", "--help")
    assert code == 0, err


def test_a_misspelt_preset_name_gets_the_shipped_one(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("validate", "--config", "tiny-shapes-stf", "sanarl.datasets.shapes")
    assert code == 2 and "Did you mean the shipped preset `tiny-shapes-sft`" in flat(err)
    code, _, err = run_cli("presets", "--copy", "tiny-shape-nft", tmp_path)
    assert code == 2 and "Did you mean `tiny-shapes-nft`" in flat(err)
    assert not any(tmp_path.iterdir())


def test_a_misspelt_key_gets_the_key_of_the_same_words(run_cli):
    code, _, err = run_cli("validate", *SHAPES, "--set", "train.optm_learning_rate=1e-4")
    assert code == 2 and "did you mean `train.optm_lr`?" in flat(err)
    code, _, err = run_cli("validate", *SHAPES, "--set", "train.max_steps=4")
    assert code == 2 and "did you mean `train.max_num_steps`?" in flat(err)


def test_the_plan_says_what_ends_the_run(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one table row per line
    prompts = tmp_path / "my_prompts.txt"
    prompts.write_text("a red circle\na blue square\n\na green triangle\n")
    example = str(ROOT / "examples" / "plugins" / "my_prompts.py")
    nft = ("--config", "tiny-shapes-nft", "--set", f"train.train_policy.dataset.local_dir={prompts}", example)
    code, out, err = run_cli("validate", *nft)
    assert code == 0, err
    assert (
        "1 per epoch x 1 epoch(s) -> 1 optimizer steps; the epochs end the run before train.max_num_steps = 80"
        in flat(out)
    )
    code, out, _ = run_cli("validate", *nft, "--set", "train.epoch=80")
    assert "-> 80 optimizer steps; the epochs and train.max_num_steps = 80 end the run together" in flat(out)
    code, out, _ = run_cli("validate", *SHAPES, "--set", "train.max_num_steps=3")
    assert "-> 3 optimizer steps; train.max_num_steps = 3 ends the run" in flat(out)
    code, out, _ = run_cli(
        "validate", *SHAPES, "--set", "train.max_num_steps=null", "--set", "train.max_wall_minutes=2"
    )
    assert (
        "the epochs end the run (train.max_num_steps would stop it sooner), or train.max_wall_minutes = 2"
        in flat(out)
    )


def test_the_cosmos_rl_sft_check_runs_outside_the_checkout_and_names_the_table(tmp_path):
    """docs/cosmos-rl.md's SFT validate line, typed in a Cosmos-RL checkout (here: a folder with its `configs/`),
    finds sanarl's shipped examples, and its note keeps the `[policy.parallelism]` name (not read as markup)."""
    import shlex

    doc = (ROOT / "docs" / "cosmos-rl.md").read_text()
    line = next(x for x in doc.splitlines() if x.startswith("sanarl validate") and "sana-image-sft-lora" in x)
    (tmp_path / "configs").symlink_to(ROOT / "tests" / "data" / "cosmos_rl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SANARL_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "sanarl", *shlex.split(line)[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "and [policy.parallelism] declares 8 ranks" in flat(done.stdout + done.stderr)
