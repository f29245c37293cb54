"""The config loader is handed its method table (sanarl/config/method_rules.py, docs/architecture.md "Layers"): it
accepts the pairs of the table it gets and runs their checks and warnings; `sanarl.methods.config_loading` hands it the
registry's, and loading a config that way imports no torch and fills nothing on import."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sanarl.config import loader
from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods import registry
from sanarl.methods.config_loading import loads_config

ROOT = Path(__file__).resolve().parents[2]
SFT = '[train.train_policy]\ntype = "sft"\ntrainer_type = "{}"\n'


def _warn(cfg: Config) -> list[str]:
    return ["mine warns"]


def _refuse(cfg: Config) -> None:
    raise ConfigError("mine refuses")


@dataclass(frozen=True)
class Rules:
    """A table entry as the loader sees it (`config.method_rules.MethodRules`), without a task."""

    policy_type: str = "sft"
    trainer_type: str = "mine"
    validate: Callable[[Config], None] | None = None
    warnings: Callable[[Config], list[str]] = _warn


def test_the_loader_accepts_the_pairs_of_the_table_it_is_handed() -> None:
    loaded = loader.loads_config(SFT.format("mine"), methods=(Rules(),))
    assert loaded.notes[0] == "mine warns"
    with pytest.raises(ConfigError, match="mine refuses"):
        loader.loads_config(SFT.format("mine"), methods=(Rules(validate=_refuse),))
    with pytest.raises(
        ConfigError, match=r"trainer_type` = '' is not valid for type = 'sft'; set it to one of 'mine'"
    ):
        loader.loads_config(SFT.format(""), methods=(Rules(),))


def test_the_registry_table_is_the_one_the_commands_load_with(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="'mine'"):
        loads_config(SFT.format("mine"))
    monkeypatch.setattr(registry, "METHODS", (*registry.METHODS, Rules()))
    assert "mine warns" in loads_config(SFT.format("mine")).notes


def test_loading_imports_no_torch_and_importing_sanarl_fills_no_table() -> None:
    code = (
        "import sys\n"
        "import sanarl.config\n"
        "assert not any(m.startswith('sanarl.methods') for m in sys.modules), 'import side effect'\n"
        "from sanarl.methods.config_loading import load_config\n"
        "load_config('tiny-shapes-ddrl')\n"
        "assert 'torch' not in sys.modules, 'loading imported torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_config_is_checked_once_and_an_edited_one_again() -> None:
    """The task built from a loaded config finds it checked (the same function, not run twice); a config changed
    after load, in place or as a copy, meets every check again."""
    calls: list[int] = []

    def counted(cfg: Config) -> None:
        calls.append(cfg.train.seed)

    table = (Rules(validate=counted),)
    cfg = loader.loads_config(SFT.format("mine") + "[train]\nseed = 7\n", methods=table).config
    assert loader.check_config(cfg, table) == ["mine warns"] and calls == [7]
    copy = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=8))
    loader.check_config(copy, table)
    assert calls == [7, 8]
    cfg.train.seed = -1  # in place: a new repr, checked again (and refused by the field's range)
    with pytest.raises(ConfigError, match=r"train.seed"):
        loader.check_config(cfg, table)
    assert loader.check_config(copy, (Rules(validate=counted, warnings=lambda c: []),)) == []
    assert calls == [7, 8, 8]  # another table: checked again
