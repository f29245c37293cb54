"""A run component of the user's own (`train.components`, docs/architecture.md "Run components"): the example of
the docs, as written there, trains through the CLI and writes what the test reads; a module that is missing, or
defines no `build_component`, stops the command with exit code 2 naming the key and the module, before anything is
written; what `build_component` returns is checked when the run builds its components."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sanarl.config.presets import resolve_preset_path
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_INTRO = "Your own components join through `train.components`"


def docs_example() -> str:
    """The python block that follows the paragraph on `train.components` in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    after = text[text.index(EXAMPLE_INTRO) :]
    return re.search(r"```python\n(.*?)```", after, flags=re.DOTALL).group(1)


def write_package(root: Path, modules: dict[str, str]) -> None:
    (root / "my_pkg").mkdir(exist_ok=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    for name, source in modules.items():
        (root / "my_pkg" / f"{name}.py").write_text(source)


def forget_my_pkg(monkeypatch) -> None:
    """Each test's `my_pkg` is imported afresh (tests write different ones under the same name)."""
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.slow
def test_the_documented_component_trains_through_the_cli_and_logs_each_step(tmp_path):
    write_package(tmp_path, {"step_log": docs_example()})
    run = tmp_path / "run"
    sets = [f"train.output_dir={run}", "train.max_num_steps=3", 'train.components=["my_pkg.step_log"]',
            "validation.enable=false", "train.ckpt.export_safetensors=false"]  # fmt: skip
    cmd = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes"]
    cmd += [arg for value in sets for arg in ("--set", value)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (run / "step_log.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [(m["step"], m["loss"]) for m in metrics if "loss" in m]
    assert [(e["step"], e["loss"]) for e in logged] == trained
    assert [step for step, _ in trained] == [1, 2, 3]


MODULES = {
    "no_factory": "NAME = 'a module without build_component'\n",
    "not_callable": "build_component = 'not a function'\n",
    "raises": "raise RuntimeError('broken at import')\n",
}


@pytest.mark.parametrize(
    ("entry", "needles"),
    [
        (
            "my_pkg.nowhere",
            ["`train.components[0]`", "'my_pkg.nowhere'", "no module `my_pkg.nowhere`", "PYTHONPATH"],
        ),
        ("absent_pkg.step_log", ["`train.components[0]`", "no module `absent_pkg.step_log`", "`absent_pkg`"]),
        (
            "my_pkg.no_factory",
            ["`train.components[0]`", "module `my_pkg.no_factory`", "defines no `build_component`"],
        ),
        ("my_pkg.not_callable", ["`train.components[0]`", "has a str as its `build_component`"]),
        (
            "my_pkg.raises",
            ["`train.components[0]`", "module `my_pkg.raises` raised RuntimeError: broken at import"],
        ),
        ("my pkg", ["`train.components`", "must list dotted module names"]),
    ],
)
def test_a_bad_component_entry_stops_the_run_before_anything_is_written(
    tmp_path, monkeypatch, refused, entry, needles
):
    write_package(tmp_path, MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_my_pkg(monkeypatch)
    refused("tiny-shapes-sft", "sanarl.datasets.shapes", [f'train.components=["{entry}"]'], needles)


def test_sanarl_validate_names_the_second_entry(tmp_path, monkeypatch, run_cli):
    write_package(tmp_path, {"fine": "def build_component(cfg, run, run_dir):\n    return None\n", **MODULES})
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_my_pkg(monkeypatch)
    entries = '["my_pkg.fine", "my_pkg.no_factory"]'
    code, _, err = run_cli("validate", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes",
                           "--set", f"train.components={entries}")  # fmt: skip
    assert code == 2, err
    assert "`train.components[1]` = 'my_pkg.no_factory'" in " ".join(err.split())


COMPONENTS = """
from sanarl.training.component_hooks import RunComponent

class Named(RunComponent):
    def __init__(self, name):
        self.name = name

def build_component(cfg, run, run_dir):
    return {built}
"""


@pytest.mark.parametrize(
    ("built", "needles"),
    [
        ("object()", ["`train.components[1]`", "returned object, not a RunComponent or None"]),
        ("Named('state')", ["has name 'state'", "other than ['state']"]),
        ("Named('')", ["has name ''", "a word of letters"]),
        ("Named('first')", ["has name 'first', which another component of this run has"]),
    ],
)
def test_what_build_component_returns_is_checked_when_the_run_builds_it(
    tmp_path, monkeypatch, built, needles
):
    from sanarl.training.component_set import build_components

    modules = {"first": COMPONENTS.format(built="Named('first')"), "built": COMPONENTS.format(built=built)}
    write_package(tmp_path, modules)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_my_pkg(monkeypatch)
    overrides = ['train.components=["my_pkg.first", "my_pkg.built"]']
    cfg = load_config(resolve_preset_path("tiny-shapes-sft"), overrides).config
    run = SimpleNamespace(acc=SimpleNamespace(is_main_process=True))
    with pytest.raises(ConfigError) as err:
        build_components(cfg, run, tmp_path / "run", held_out_rewards=lambda: {})
    message = " ".join(str(err.value).split())
    assert all(n in message for n in needles), message


def test_the_run_builds_the_components_in_the_listed_order(tmp_path, monkeypatch):
    from sanarl.training.component_set import build_components

    modules = {name: COMPONENTS.format(built=f"Named({name!r})") for name in ("first", "second")}
    modules["skipped"] = COMPONENTS.format(built="None")
    write_package(tmp_path, modules)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_my_pkg(monkeypatch)
    overrides = ['train.components=["my_pkg.second", "my_pkg.skipped", "my_pkg.first"]']
    cfg = load_config(resolve_preset_path("tiny-shapes-sft"), overrides).config
    run = SimpleNamespace(acc=SimpleNamespace(is_main_process=True))
    built = build_components(cfg, run, tmp_path / "run", held_out_rewards=lambda: {})
    assert [component.name for component in built] == ["second", "first"]
