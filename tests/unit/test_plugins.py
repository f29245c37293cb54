"""Dataset-plugin resolution: dotted modules and .py files, the three failure kinds, and the factory contract."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from sanarl.config import check_plugin, dataset_plugins, plugin_label, resolve_plugin
from sanarl.errors import PluginError, UserError

BAD = Path(__file__).resolve().parents[1] / "data" / "bad_plugins"

GOOD_SOURCE = (
    "def get_dataset(config):\n"
    "    return [{'prompt': 'a red cube', 'metadata': {'n': config}}]\n"
    "\n"
    "collate = None\n"
)


@pytest.fixture(autouse=True)
def restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """resolve_plugin puts a plugin file's folder on sys.path; undo that after each test."""
    monkeypatch.setattr(sys, "path", [*sys.path])


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Make a uniquely named importable package in tmp_path; returns (name, folder)."""
    name = f"sanarl_testpkg_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, folder
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


# ---------------------------------------------------------------------------------------------------------------
# Success paths
# ---------------------------------------------------------------------------------------------------------------


def test_dotted_module(package) -> None:
    name, folder = package
    (folder / "data.py").write_text(GOOD_SOURCE, encoding="utf-8")
    module = resolve_plugin(f"{name}.data")
    assert module.__name__ == f"{name}.data"
    check_plugin(module)
    assert module.get_dataset(3) == [{"prompt": "a red cube", "metadata": {"n": 3}}]
    assert plugin_label(module) == f"`{name}.data`"


def test_file_by_absolute_and_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "helpers_for_plugin.py").write_text("PROMPT = 'from a sibling'\n", encoding="utf-8")
    source = GOOD_SOURCE.replace("'a red cube'", "helpers_for_plugin.PROMPT")
    path = tmp_path / "my_plugin.py"
    path.write_text("import helpers_for_plugin\n" + source, encoding="utf-8")
    module = resolve_plugin(str(path))
    check_plugin(module)
    assert module.get_dataset(None)[0]["prompt"] == "from a sibling"  # sibling import works
    assert plugin_label(module) == f"`{path}`"
    monkeypatch.chdir(tmp_path)
    assert resolve_plugin("./my_plugin.py") is module  # same file -> same cached module
    assert resolve_plugin("my_plugin.py") is module
    sys.modules.pop("helpers_for_plugin", None)


# ---------------------------------------------------------------------------------------------------------------
# Not found
# ---------------------------------------------------------------------------------------------------------------


def test_dotted_module_not_found() -> None:
    with pytest.raises(PluginError) as info:
        resolve_plugin("sanarl_no_such_pkg_xyz.data")
    msg = str(info.value)
    assert "dataset plugin `sanarl_no_such_pkg_xyz.data` was not found" in msg
    assert "no importable module named `sanarl_no_such_pkg_xyz`" in msg
    assert "raised" not in msg
    assert isinstance(info.value, UserError) and info.value.exit_code == 2


def test_missing_submodule_of_existing_package(package) -> None:
    name, _ = package
    with pytest.raises(
        PluginError, match=rf"`{name}\.nothing_here` was not found: no importable module named"
    ):
        resolve_plugin(f"{name}.nothing_here")


def test_not_found_suggests_a_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_plugins, "builtin_plugins", lambda: ["sanarl.datasets.shapes"])
    with pytest.raises(PluginError) as info:
        resolve_plugin("sanarl.datasets.shapez")
    msg = str(info.value)
    assert "Did you mean `sanarl.datasets.shapes`?" in msg
    assert "Built-in plugins: sanarl.datasets.shapes." in msg


def test_not_found_points_to_a_local_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "local_plugin_abc.py").write_text(GOOD_SOURCE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        PluginError, match=r"A file `local_plugin_abc\.py` exists here: pass it as `\./local_plugin_abc\.py`"
    ):
        resolve_plugin("local_plugin_abc")


def test_file_not_found_says_the_path_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PluginError) as info:
        resolve_plugin("./plugins/missing_plugin.py")
    msg = str(info.value)
    assert "dataset plugin file `./plugins/missing_plugin.py` does not exist" in msg
    assert str(tmp_path / "plugins" / "missing_plugin.py") in msg


@pytest.mark.parametrize(("make", "kind"), [("dir", "is a directory"), ("txt", "is not a .py file")])
def test_path_that_is_not_a_py_file(tmp_path: Path, make: str, kind: str) -> None:
    target = tmp_path / "thing"
    if make == "dir":
        target.mkdir()
    else:
        target = tmp_path / "thing.txt"
        target.write_text("x", encoding="utf-8")
    with pytest.raises(PluginError, match=kind):
        resolve_plugin(str(target))


@pytest.mark.parametrize("spec", ["", "   ", "my plugin", "pkg..data", "9lives"])
def test_empty_or_invalid_spec(spec: str) -> None:
    with pytest.raises(PluginError, match=r"empty|neither a dotted module name nor a path"):
        resolve_plugin(spec)


# ---------------------------------------------------------------------------------------------------------------
# Raised while importing
# ---------------------------------------------------------------------------------------------------------------


def test_file_plugin_that_raises_keeps_the_traceback() -> None:
    with pytest.raises(PluginError) as info:
        resolve_plugin(str(BAD / "raises_on_import.py"))
    msg = str(info.value)
    assert "was found but raised RuntimeError while importing: boom: plugin setup failed for 4" in msg
    assert "Traceback (most recent call last)" in msg
    assert "raises_on_import.py" in msg and 'raise RuntimeError("boom: plugin setup failed for "' in msg
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not any("raises_on_import" in m for m in sys.modules)  # a failed import is not cached


def test_nested_missing_import_in_file_is_raised_not_not_found() -> None:
    with pytest.raises(PluginError) as info:
        resolve_plugin(str(BAD / "nested_missing_import.py"))
    msg = str(info.value)
    assert "raised ModuleNotFoundError while importing" in msg
    assert "install the missing dependency `sanarl_missing_dependency_xyz`" in msg
    assert "was not found" not in msg
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_nested_missing_import_in_dotted_module_is_raised_not_not_found(package) -> None:
    name, folder = package
    (folder / "data.py").write_text("import sanarl_missing_dependency_abc\n", encoding="utf-8")
    with pytest.raises(PluginError) as info:
        resolve_plugin(f"{name}.data")
    msg = str(info.value)
    assert f"dataset plugin `{name}.data` was found but raised ModuleNotFoundError" in msg
    assert "No module named 'sanarl_missing_dependency_abc'" in msg
    assert "was not found" not in msg


def test_dotted_module_with_syntax_error(package) -> None:
    name, folder = package
    (folder / "data.py").write_text("def get_dataset(config)\n    return []\n", encoding="utf-8")
    with pytest.raises(PluginError) as info:
        resolve_plugin(f"{name}.data")
    assert "raised SyntaxError while importing" in str(info.value)
    assert "data.py" in str(info.value)
    assert isinstance(info.value.__cause__, SyntaxError)


# ---------------------------------------------------------------------------------------------------------------
# Contract
# ---------------------------------------------------------------------------------------------------------------


def test_missing_required_factory_lists_names_and_contract() -> None:
    module = resolve_plugin(str(BAD / "missing_factory.py"))
    with pytest.raises(PluginError) as info:
        check_plugin(module)
    msg = str(info.value)
    assert f"dataset plugin `{BAD / 'missing_factory.py'}` does not define `get_dataset`." in msg
    assert "must define `get_dataset(config) -> Dataset`" in msg
    assert (
        "may define `get_val_dataset(config) -> Dataset | None`; `collate(items: list[dict]) -> batch`" in msg
    )
    assert "docs/plugins.md" in msg
    with pytest.raises(PluginError, match="does not define `get_dataset`, `get_prompts`"):
        check_plugin(module, required=("get_dataset", "get_val_dataset", "get_prompts"))


def test_required_factory_that_is_not_callable() -> None:
    module = resolve_plugin(str(BAD / "not_callable.py"))
    with pytest.raises(PluginError, match=r"`get_dataset` in dataset plugin .* is int 42, not a function"):
        check_plugin(module)


def test_optional_factory_must_be_callable_or_none(tmp_path: Path) -> None:
    path = tmp_path / "odd_collate.py"
    path.write_text("def get_dataset(config):\n    return []\n\ncollate = 'stack'\n", encoding="utf-8")
    with pytest.raises(PluginError, match=r"`collate` in dataset plugin .* is str 'stack', not a function"):
        check_plugin(resolve_plugin(str(path)))
    path.write_text("def get_dataset(config):\n    return []\n\ncollate = None\n", encoding="utf-8")
    fresh = tmp_path / "none_collate.py"
    path.rename(fresh)
    check_plugin(resolve_plugin(str(fresh)))  # None = use the default collate
