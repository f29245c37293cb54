"""Tests of the worked plugin example examples/plugins/my_prompts.py, loaded by file path like the CLI does."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from sanarl.config.dataset_plugins import check_plugin, resolve_plugin
from sanarl.config.schema import Config
from sanarl.datasets.common import collate
from sanarl.errors import DataError

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "my_prompts.py"


def _load_plugin() -> ModuleType:
    """The example module, resolved by file path exactly as the CLI resolves its positional argument."""
    module = resolve_plugin(str(PLUGIN))
    check_plugin(module)  # get_dataset callable; get_val_dataset / collate callable or absent
    return module


def _config(train: Path | str, val: Path | str = "") -> Config:
    config = Config()
    config.train.train_policy.type = "grpo"
    config.train.train_policy.dataset.local_dir = str(train)
    config.validation.dataset.local_dir = str(val)
    return config


def test_prompts_are_the_non_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("a red cube\n\n   \n  two blue spheres  \nthree\n")
    plugin = _load_plugin()
    ds = plugin.get_dataset(_config(tmp_path / "train.txt"))
    assert len(ds) == 3
    assert [ds[i] for i in range(3)] == [
        {"prompt": "a red cube", "metadata": {}},
        {"prompt": "two blue spheres", "metadata": {}},
        {"prompt": "three", "metadata": {}},
    ]
    assert collate([ds[0], ds[2]]) == {"prompt": ["a red cube", "three"], "metadata": [{}, {}]}


def test_val_dataset_is_optional(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("t\n")
    (tmp_path / "val.txt").write_text("v1\nv2")  # no trailing newline
    plugin = _load_plugin()
    assert plugin.get_val_dataset(_config(tmp_path / "train.txt")) is None
    val = plugin.get_val_dataset(_config(tmp_path / "train.txt", tmp_path / "val.txt"))
    assert [val[i]["prompt"] for i in range(len(val))] == ["v1", "v2"]


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (None, r"`train\.train_policy\.dataset\.local_dir` = .*missing\.txt.*no such file"),
        ("", r"`train\.train_policy\.dataset\.local_dir` = .*no prompts"),
        ("\n  \n\n", r"`train\.train_policy\.dataset\.local_dir` = .*no prompts"),
    ],
)
def test_bad_prompt_file_is_a_data_error(tmp_path: Path, content: str | None, pattern: str) -> None:
    path = tmp_path / "missing.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=pattern):
        _load_plugin().get_dataset(_config(path))


def test_empty_local_dir_is_a_data_error() -> None:
    with pytest.raises(DataError, match=r"`train\.train_policy\.dataset\.local_dir` is empty"):
        _load_plugin().get_dataset(_config(""))
