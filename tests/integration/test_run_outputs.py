"""What a run leaves behind, as a user runs it (`python -m sanarl` from an unrelated directory, an 80-column
terminal): metrics.png is written at each checkpoint (a run that dies later still has it) with an lr panel, sample
and rollout grids carry a step label above the tiles and the reward's name under each sample, and the progress
bar keeps every metric (wrapped, not cut)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

FAILING_PLUGIN = '''
import torch
from sanarl.errors import DataError

class Squares(torch.utils.data.Dataset):
    """32x32 squares; the training set's 13th read (step 4 of 4 items a step) raises, as corrupt data would."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 64

    def __getitem__(self, i):
        self.reads += 1
        if self.reads > 12:
            raise DataError("item %d of the test data is corrupt" % i)
        image = torch.zeros(3, 32, 32)
        image[0, 8:24, 8:24] = 1.0
        return {"prompt": "a red square", "image": image}

def get_dataset(config):
    return Squares()
'''


def _sanarl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # a narrow terminal (rich draws its live progress bar only on one: FORCE_COLOR makes it one)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "60", "FORCE_COLOR": "1", "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-m", "sanarl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def _sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def _final_bar(stdout: str) -> str:
    """The last frame of the live progress bar, as the terminal shows it (escape codes dropped)."""
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", stdout)
    last = text[text.rindex("train ") :]
    return " ".join(last.split())


def _title_band_has_text(path: Path) -> bool:
    pixels = np.asarray(Image.open(path).convert("L"))
    return bool((pixels[:14] < 128).any())  # dark text in the band above the first row of tiles


def test_metrics_png_at_each_checkpoint_and_step_labels_on_sample_grids(tmp_path):
    plugin = tmp_path / "failing.py"
    plugin.write_text(FAILING_PLUGIN)
    run = tmp_path / "run"
    overrides = _sets(
        f"train.output_dir={run}",
        "train.train_batch_per_replica=4",
        "train.train_policy.mini_batch=4",
        "train.ckpt.save_freq=2",
        "train.optm_warmup_steps=2",
        "logging.log_freq=1",
        "validation.freq=2",
        "validation.val_before_train=false",
        "validation.num_samples=2",
        "validation.batch_size=2",
        "policy.diffusers.sample.eval_num_steps=2",
        "logging.logger=console,tensorboard",
    )
    done = _sanarl(tmp_path, "--config", "tiny-shapes-sft", str(plugin), *overrides)
    assert done.returncode == 2 and "is corrupt" in done.stderr, done.stdout + done.stderr[-3000:]
    assert (run / "checkpoints" / "step_00000002").is_dir()
    plot = Image.open(run / "metrics.png")  # from the step-2 checkpoint: the run never reached its end
    assert plot.size == (int(4.5 * 3 * 110), int(3.2 * 110))  # loss, grad_norm, lr
    assert _title_band_has_text(run / "samples" / "step_00000002.png")
    bar = _final_bar(done.stdout)
    assert re.search(r"loss=\S+ grad_norm=\S+ samples_per_s=[0-9.]+$", bar), bar
    events = _tensorboard_events(run / "tensorboard")  # docs/logging.md's keys
    assert {"loss", "grad_norm", "lr", "samples_per_s"} <= set(events["scalars"])
    assert events["images"] == ["samples"]
    assert_readme_lists(run)


def _tensorboard_events(directory: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return acc.Tags()


def assert_readme_lists(run: Path) -> None:
    """Every entry the run left is in the README's table of outputs."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## What a run leaves behind") : readme.index("Resume with")]
    listed = set(re.findall(r"`([\w.]+)[/`]", table))
    assert {p.name for p in run.iterdir()} <= listed, (sorted(p.name for p in run.iterdir()), listed)


def test_rollout_grids_name_the_reward_and_the_step(tmp_path):
    run = tmp_path / "run"
    overrides = _sets(
        f"train.output_dir={run}",
        "train.max_num_steps=1",
        "train.train_batch_per_replica=4",
        "train.train_policy.mini_batch=4",
        "rollout.n_generation=2",
        "rollout.batch_size=4",
        "policy.diffusers.sample.num_steps=2",
        "logging.multi_modal_log_interval=1",
        "validation.enable=false",
        "validation.val_before_train=false",
    )
    done = _sanarl(tmp_path, "--config", "tiny-shapes-nft", "sanarl.datasets.shapes", *overrides)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _title_band_has_text(run / "rollouts" / "step_00000000.png")
    bar = _final_bar(done.stdout)
    assert re.search(r"loss=\S+ reward/mean=\S+ grad_norm=\S+ samples_per_s=[0-9.]+ done:", bar), bar
    assert_readme_lists(run)


def test_the_rollout_caption_label_is_the_reward_name():
    from sanarl.methods.group_rl.task_base import GroupRLTask

    def task(*names: str) -> SimpleNamespace:
        fns = [SimpleNamespace(name=n) for n in names]
        return SimpleNamespace(
            view=SimpleNamespace(train_policy=SimpleNamespace(remote_reward=SimpleNamespace(reward_fns=fns)))
        )

    assert GroupRLTask.reward_label(task("shapes")) == "shapes"
    assert GroupRLTask.reward_label(task("pickscore", "ocr")) == "reward"


def test_long_captions_are_kept_whole_and_grow_the_text_band():
    from sanarl.core.images import caption_lines, grid_canvas

    caption = "model-b: " + " ".join(f"word{i}" for i in range(30))
    lines = caption_lines(caption, 128)
    assert " ".join(lines) == caption and len(lines) > 3
    tiles = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    short, long = grid_canvas(tiles, ["a", "b"], 2, 128), grid_canvas(tiles, ["a", caption], 2, 128)
    assert long.size[1] - short.size[1] == 11 * len(lines) + 2 - 34  # the band grows past its 3 lines


def test_the_eval_table_wraps_on_a_narrow_terminal_and_cuts_nothing():
    from rich.console import Console

    from sanarl.evaluation.console import results_table

    score = {"mean": 0.123456, "stderr": 0.0123}
    models = {
        label: {"scores": {"shapes/exact_partial_strict": score, "heldout/clipscore": score}, "geneval": {}}
        for label in ("base: sanarl-tiny:shapes-base", "outputs/tiny-shapes-nft/export")
    }
    delta = {"delta": 0.0421, "stderr": 0.0101}
    comparison = {
        "outputs/tiny-shapes-nft/export": {"shapes/exact_partial_strict": delta, "heldout/clipscore": delta}
    }
    summary = {"models": models, "comparison": comparison, "prompts": {"n": 64, "source": "shapes:test"}}
    console = Console(width=80, record=True, force_terminal=False)
    console.print(results_table(summary))
    text = console.export_text()
    assert "…" not in text
    columns: list[str] = ["", "", "", ""]  # each column's text, its folded lines joined
    for line in text.splitlines():
        if line.startswith(("│", "┃")):
            for i, cell in enumerate(re.split("[│┃]", line)[1:-1]):
                columns[i] += cell.strip()
    assert "shapes/exact_partial_strict" in columns[0] and "heldout/clipscore" in columns[0]
    assert columns[2].startswith("outputs/tiny-shapes-nft/export")
    assert columns[3].count("+0.0421 ± 0.0101") == 2
