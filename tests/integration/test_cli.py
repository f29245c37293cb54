"""The CLI on good and bad input: exit codes, messages that name the key / file and the fix, nothing written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "sanarl" / "presets").glob("*.toml"))
SQUARES = str(ROOT / "tests" / "data" / "plugins" / "squares.py")
BAD = ROOT / "tests" / "data" / "bad_plugins"
EXAMPLE_PLUGIN = ROOT / "examples" / "plugins" / "my_prompts.py"
TINY = ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml"


def preset_command(path: Path) -> list[str]:
    """The exact command of a preset's header comment (line 2), as argv after `sanarl`."""
    line = path.read_text().splitlines()[1]
    match = re.match(r"#\s*sanarl (.*)$", line)
    assert match, f"{path.name}: line 2 must be the exact command, got {line!r}"
    return match.group(1).split()


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_shipped_preset_validates(preset, run_cli, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = preset_command(preset)
    assert args[:2] == ["--config", preset.stem]
    code, out, err = run_cli("validate", *args)
    assert code == 0, err
    assert "valid" in out and "sanarl plan" in out


def test_presets_lists_each_preset_with_its_purpose(run_cli):
    code, out, _ = run_cli("presets")
    assert code == 0
    for preset in PRESETS:
        assert preset.stem in out


def test_presets_shows_each_file_and_copies_one_out(run_cli, tmp_path):
    code, out, _ = run_cli("presets")
    assert code == 0 and "accelerate configs" in out
    flat = "".join(out.split())  # rich folds long paths over lines
    for preset in PRESETS:
        assert "".join(str(preset).split()) in flat
    code, out, _ = run_cli("presets", "--copy", "tiny-shapes-nft", tmp_path)
    assert code == 0 and (tmp_path / "tiny-shapes-nft.toml").is_file()
    code, _, err = run_cli("presets", "--copy", "tiny-shapes-nft", tmp_path)
    assert code == 2 and "already exists" in err


@pytest.mark.parametrize("flags", [["--help"], ["-h"], []])
def test_help_lists_every_command_one_line_each(run_cli, flags):
    from sanarl.cli import SUBCOMMANDS, tools

    code, out, _ = run_cli(*flags)
    assert code == 0
    commands = [line.strip() for line in out.split("Commands:\n")[1].split("\n\n")[0].splitlines()]
    names = [line.split("  ")[0] for line in commands]
    expected = ["sanarl [train] --config PRESET PLUGIN", "sanarl validate", "sanarl presets", "sanarl eval"]
    assert names[:4] == expected and "sanarl bench shapes" in names and names[-1] == "sanarl-reward --help"
    assert len(names) == len(tools.registered_commands) + 3  # + train, bench shapes, sanarl-reward
    assert set(SUBCOMMANDS) <= {name.split()[1] for name in names[:-1]}
    assert all(len(line.split("  ", 1)) == 2 and line.split("  ", 1)[1].strip() for line in commands)


def test_train_is_also_an_explicit_command(run_cli):
    code, out, _ = run_cli("train", "--help")
    assert code == 0 and "--config" in out and "--dry-run" in out


def test_prompts_outside_the_shapes_grammar_stop_before_any_model_loads(run_cli, tmp_path, monkeypatch):
    import sanarl.api  # imported before the patch: api binds load_adapter at import, and keeps it past the test
    import sanarl.models

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the prompts were checked")

    # both names: sanarl.api binds load_adapter when first imported, which may be now or in an earlier test
    monkeypatch.setattr(sanarl.models, "load_adapter", no_model)
    monkeypatch.setattr(sanarl.api, "load_adapter", no_model)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\na cat on a sofa\n")
    args = (
        "--config",
        "tiny-shapes-nft",
        str(EXAMPLE_PLUGIN),
        "--set",
        f"train.train_policy.dataset.local_dir={prompts}",
    )
    for command in (("validate",), ()):
        code, _, err = run_cli(*command, *args, "--set", f"train.output_dir={tmp_path / 'run'}")
        msg = " ".join(err.split())
        assert code == 2, err
        assert "training data, item 1: reward 'shapes': prompt 'a cat on a sofa'" in msg, msg
        assert "shapes grammar: '[a|one|two|three|four] [colour] shape[s]'" in msg
    assert not (tmp_path / "run").exists()
    prompts.write_text("a red circle\ntwo blue squares\n")
    code, out, err = run_cli("validate", *args)
    assert code == 0 and "valid" in out, err


def bad(run_cli, tmp_path, *args: str, traceback_ok: bool = False) -> str:
    out_dir = tmp_path / "run"
    code, out, err = run_cli(*args, "--set", f"train.output_dir={out_dir}")
    assert code == 2, (out, err)
    assert not out_dir.exists(), "bad input must not leave a half-written run directory"
    assert traceback_ok or "Traceback" not in err
    return " ".join(err.split())


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "preset.toml"
    path.write_text(text)
    return path


def test_malformed_toml_names_line_and_column(run_cli, tmp_path):
    preset = write(tmp_path, "[train]\noptm_lr = = 3\n")
    msg = bad(run_cli, tmp_path, "--config", str(preset), SQUARES)
    assert "line 2" in msg and "column" in msg and str(preset) in msg


def test_unknown_key_suggests_the_right_one(run_cli, tmp_path):
    preset = write(tmp_path, "[train]\noptm_lrr = 3e-4\n")
    msg = bad(run_cli, tmp_path, "--config", str(preset), SQUARES)
    assert "optm_lrr" in msg and "did you mean `train.optm_lr`" in msg


def test_wrong_type_names_key_and_type(run_cli, tmp_path):
    preset = write(tmp_path, '[train]\nepoch = "ten"\n')
    msg = bad(run_cli, tmp_path, "--config", str(preset), SQUARES)
    assert "train.epoch" in msg and "int" in msg


def test_bad_override(run_cli, tmp_path):
    msg = bad(run_cli, tmp_path, "--config", str(TINY), SQUARES, "--set", "train.max_num_steps=many")
    assert "train.max_num_steps" in msg


def test_unknown_plugin_module(run_cli, tmp_path):
    msg = bad(run_cli, tmp_path, "--config", str(TINY), "no_such_pkg.data")
    assert "no_such_pkg.data" in msg and "not found" in msg


def test_plugin_that_raises_keeps_its_traceback(run_cli, tmp_path):
    msg = bad(run_cli, tmp_path, "--config", str(TINY), str(BAD / "raises_on_import.py"), traceback_ok=True)
    assert (
        "raised RuntimeError while importing" in msg and "raises_on_import.py" in msg and "Traceback" in msg
    )


def test_plugin_missing_factory(run_cli, tmp_path):
    msg = bad(run_cli, tmp_path, "--config", str(TINY), str(BAD / "missing_factory.py"))
    assert "get_dataset" in msg


@pytest.mark.parametrize(
    "files",
    [{}, {"a.json": '{"prompt": "a red square"}'}],
    ids=["empty_dataset_dir", "json_without_image_only"],
)
def test_dataset_dir_without_training_items(run_cli, tmp_path, files):
    data = tmp_path / "data"
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    msg = bad(
        run_cli,
        tmp_path,
        "--config",
        str(TINY),
        "sanarl.datasets.diffusers_dataset",
        "--set",
        f"train.train_policy.dataset.local_dir={data}",
    )
    assert str(data) in msg


def test_output_dir_not_writable(run_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli("--config", str(TINY), SQUARES, "--set", f"train.output_dir={blocker}/run")
    assert code == 2 and "train.output_dir" in " ".join(err.split())


def test_resume_path_without_checkpoint(run_cli, tmp_path):
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    msg = bad(run_cli, tmp_path, "--config", str(TINY), SQUARES, "--set", f"train.resume={nothing}")
    assert "train.resume" in msg and "holds no checkpoint" in msg


def test_missing_hub_weights_stop_with_instructions(run_cli, tmp_path):
    msg = bad(
        run_cli,
        tmp_path,
        "--config",
        str(ROOT / "sanarl" / "presets" / "sana-image-sft.toml"),
        "sanarl.datasets.diffusers_dataset",
        "--set",
        f"train.train_policy.dataset.local_dir={ROOT / 'sanarl' / 'data' / 'datasets' / 'examples' / 'sft'}",
    )
    assert "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers" in msg and "hf download" in msg


def test_unavailable_task_is_named(run_cli, tmp_path):
    msg = bad(
        run_cli,
        tmp_path,
        "--config",
        str(TINY),
        SQUARES,
        "--set",
        "train.train_policy.type=grpo",
        "--set",
        "train.train_policy.trainer_type=flow_grpo",
    )
    assert "train.train_policy" in msg or "train_policy" in msg


def test_dry_run_loads_the_model_and_writes_nothing(run_cli, tmp_path):
    out_dir = tmp_path / "run"
    code, out, err = run_cli(
        "--config", str(TINY), SQUARES, "--dry-run", "--set", f"train.output_dir={out_dir}"
    )
    assert code == 0, err
    assert "dry run" in out and not out_dir.exists()
