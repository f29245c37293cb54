"""The one strict config engine (sanarl/config/engine.py): generic over its root schema, Literal choices checked
from the type (file, --set, check_config), shared by the trainer config and the reward service's."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import pytest

from sanarl.config import Config
from sanarl.config.choices import Selection, Solver, VideoReduction
from sanarl.config.engine import Context, Engine, Hooks
from sanarl.config.overrides import apply
from sanarl.config.toml_dump import dump
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import check_config, loads_config

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Inner:
    mode: Literal["fast", "slow"] = "fast"
    level: Literal[0, 1, 2] = 1
    tags: list[Literal["a", "b"]] = field(default_factory=list)


@dataclass
class Toy:
    name: str = ""
    rate: float = 1.0
    inner: Inner = field(default_factory=Inner)


def test_engine_builds_any_dataclass_tree_strictly() -> None:
    engine = Engine(Toy)
    toy = engine.build(
        engine.parse_toml('name = "x"\nrate = 2\n[inner]\nmode = "slow"\ntags = ["b"]\n', "t"), Context("t")
    )
    assert toy == Toy(name="x", rate=2.0, inner=Inner(mode="slow", tags=["b"])) and type(toy.rate) is float
    with pytest.raises(ConfigError, match=r"unknown key `inner.mod` in t; did you mean `inner.mode`\?"):
        engine.build({"inner": {"mod": "slow"}}, Context("t"))
    with pytest.raises(
        ConfigError, match=r"`inner.mode` = 'Slow' is not supported \(did you mean 'slow'\?\)"
    ):
        engine.build({"inner": {"mode": "Slow"}}, Context("t"))
    with pytest.raises(
        ConfigError, match=r"`inner.tags\[1\]` = 'c' is not supported; set it to one of 'a', 'b'"
    ):
        engine.build({"inner": {"tags": ["a", "c"]}}, Context("t"))
    with pytest.raises(ConfigError, match=r"wrong type for `inner.level` in t: expected an integer"):
        engine.build({"inner": {"level": "1"}}, Context("t"))
    assert engine.build(engine.parse_toml(dump(toy), "t"), Context("t")) == toy


def test_errors_about_a_key_of_a_file_quote_its_line() -> None:
    text = '[train]\nepoch = 1\n[[train.train_policy.remote_reward.reward_fns]]\nname = "a"\n'
    with pytest.raises(ConfigError, match=r"Change the value of `train.epoch` \(line 2: `epoch = 1.5`\)\.$"):
        loads_config(text.replace("epoch = 1", "epoch = 1.5"), source="p.toml")
    with pytest.raises(ConfigError, match=r"remove it \(line 6: `nme = 2`\)\.$"):
        loads_config(text + "[[train.train_policy.remote_reward.reward_fns]]\nnme = 2\n", source="p.toml")
    with pytest.raises(ConfigError, match=r"'sol_rl' \(line 2: `rollout.family = \"sol\"`\)\.$"):
        loads_config('# a dotted key at the top level\nrollout.family = "sol"\n' + text, source="p.toml")
    with pytest.raises(ConfigError) as info:  # --set values have no line
        loads_config(text, ["train.epoch=1.5"], source="p.toml")
    assert "(line" not in str(info.value)


def test_engine_overrides_parse_against_the_literal_after_the_hooks() -> None:
    class Rename(Hooks):
        def map_value(self, dotted, value, ctx):
            return "slow" if dotted == "inner.mode" and value == "lazy" else value

    engine = Engine(Toy, Rename())
    toy = apply(engine, Toy(), ["inner.mode=lazy", "inner.level=2", "inner.tags=a,b"], Context("--set"))
    assert toy.inner == Inner(mode="slow", level=2, tags=["a", "b"])
    with pytest.raises(ConfigError, match=r"`inner.level` = 3 is not supported; set it to one of 0, 1, 2\."):
        apply(engine, Toy(), ["inner.level=3"], Context("--set"))


def test_trainer_choices_are_checked_when_read_set_and_checked() -> None:
    with pytest.raises(ConfigError, match=r"`rollout.selection` = 'worst' is not supported"):
        loads_config('[rollout]\nselection = "worst"\n')
    with pytest.raises(
        ConfigError, match=r"`rollout.family` = 'sol' is not supported \(did you mean 'sol_rl'\?\)"
    ):
        loads_config("", ["rollout.family=sol"])
    # Cosmos-RL's spelling of a choice is mapped before the choice is checked, in a file and in --set
    loaded = loads_config("", ["rollout.backend=diffusion_nft_rollout"])
    assert loaded.config.rollout.backend == "diffusers" and "read as 'diffusers'" in loaded.notes[0]
    cfg = Config()
    cfg.policy.diffusers.sample.eval_solver = "cps"  # built in code: check_config checks the type's choices
    with pytest.raises(
        ConfigError, match=r"`policy.diffusers.sample.eval_solver` = 'cps' .* 'euler', 'dpm2', 'flow_sde'\."
    ):
        check_config(cfg)


def test_reward_service_uses_the_same_engine_with_its_wording() -> None:
    from reward_service import config as service

    assert isinstance(service.ENGINE, Engine) and service.VIDEO_REDUCTIONS == get_args(VideoReduction)
    with pytest.raises(ConfigError, match=r"^svc.toml: `log_level` = 'loud' must be one of debug \| info"):
        service.loads_service_config('log_level = "loud"\n', source="svc.toml")


def test_runtime_choice_tuples_are_the_config_literals() -> None:
    from sanarl.core.samplers import SOLVERS
    from sanarl.core.selection import SELECTION_MODES
    from sanarl.rewards.video import REDUCTIONS

    assert SOLVERS == get_args(Solver) and SELECTION_MODES == get_args(Selection)
    assert REDUCTIONS == get_args(VideoReduction)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return out | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_engine_modules_know_no_schema_and_method_checks_stay_movable() -> None:
    for name in ("engine.py", "overrides.py", "toml_dump.py"):
        sanarl_imports = {m for m in _imports(ROOT / "sanarl/config" / name) if m.startswith("sanarl")}
        generic = {"sanarl.errors", "sanarl.config.engine", "sanarl.config.suggest"}  # suggest: names only
        assert sanarl_imports <= generic, (name, sanarl_imports)
    for config in sorted(
        (ROOT / "sanarl/methods").glob("*/config.py")
    ):  # each method's checks: no torch, no engine
        used = {m for m in _imports(config) if m.startswith("sanarl")}
        allowed = ("sanarl.errors", "sanarl.config.", "sanarl.methods.group_rl.config", "sanarl.methods.work")
        # another method's checks may be reused (DDRL runs Flow-GRPO's): those modules obey the same rule
        reused = {m for m in used if m.startswith("sanarl.methods.") and m.endswith(".config")}
        assert all(m == "sanarl.errors" or m.startswith(allowed) or m in reused for m in used), (config, used)


def test_config_modules_stay_under_500_lines() -> None:
    files = [*(ROOT / "sanarl/config").glob("*.py"), ROOT / "reward_service/config.py"]
    assert {f.name: n for f in files if (n := len(f.read_text().splitlines())) > 500} == {}
