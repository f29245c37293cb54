"""Load a TOML preset into the typed `Config`, apply `--set` overrides, check it, and write it back as TOML.

Precedence: `--set` overrides > preset file > the defaults of `schema.py`.

The strict build (unknown keys with a did-you-mean, exact types, Literal choices) is the generic engine of
`engine.py` (with `overrides.py` for `--set` and `toml_dump.py` for the writer); Cosmos-RL's keys plug into it
through `schema_hooks.CosmosHooks`: keys of Cosmos-RL's schema that sanarl does not use are accepted, dropped,
listed in `LoadedConfig.ignored` and kept with their values in `LoadedConfig.cosmos`; aliases and Cosmos-RL
spellings of values are renamed with a note in `LoadedConfig.notes`. The checks are `checks.py` (generic) and
each method's `validate(cfg)` and `warnings(cfg)` (sanarl/methods/<method>/config.py), run by `check_config`.

The loader knows no method: its caller hands it the method table (`methods`, a `methods.MethodTable`), which
says which `(train.train_policy.type, trainer_type)` pairs exist and holds their checks. The method registry's
table is that argument everywhere: `sanarl.methods.config_loading` binds it (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sanarl.config import checks, toml_dump
from sanarl.config.cosmos import drop_in
from sanarl.config.cosmos.schema_hooks import CosmosHooks
from sanarl.config.engine import Context, Engine
from sanarl.config.method_rules import MethodTable
from sanarl.config.overrides import apply as apply_to
from sanarl.config.presets import anchor_dir, anchor_paths, preset_names, presets_dir, resolve_preset_path
from sanarl.config.schema import Config
from sanarl.config.sol_rl_names import resolve_sol_rl_name
from sanarl.config.suggest import closest
from sanarl.config.user_components import check_components
from sanarl.errors import ConfigError

ENGINE = Engine(Config, CosmosHooks())
"""The trainer config's engine: sanarl's schema with Cosmos-RL's keys accepted."""


@dataclass
class LoadedConfig:
    """A resolved preset: the typed config plus what the loader dropped or renamed on the way."""

    config: Config
    ignored: list[str] = field(default_factory=list)
    """Dotted paths of accepted-but-ignored Cosmos-RL keys (file and `--set`)."""
    notes: list[str] = field(default_factory=list)
    """Alias notes and the warnings of `check_config`."""
    source: Path = Path("<string>")
    """The preset file (absolute), or `<string>` for text loaded with `loads_config`."""
    cosmos: dict[str, Any] = field(default_factory=dict)
    """Dropped Cosmos-RL keys -> their values, `--set` overrides applied (e.g. `policy.parallelism.dp_shard_size`)."""
    given: set[str] = field(default_factory=set)
    """Dotted paths (list indices as `[i]`) of the schema keys the file or an override set (the rest are defaults)."""


def load_config(path: str | Path, overrides: Sequence[str] = (), *, methods: MethodTable) -> LoadedConfig:
    """Read the TOML preset at `path` (or the shipped preset of that name, or the preset behind one of Sol-RL's
    config names, with a note saying which: sanarl.config.sol_rl_names), apply `overrides` ("dotted.key=value"),
    check against `methods`, and return the result.

    Raises `ConfigError` for a missing/unreadable file, malformed TOML (with line and column), unknown keys, wrong
    types, malformed overrides and inconsistent values (see `check_config`).
    """
    file = resolve_preset_path(path)  # a path, or the name of a shipped preset
    alias = None if file.is_file() else resolve_sol_rl_name(str(path))  # Sol-RL's config names
    if alias is not None:
        loaded = load_config(
            presets_dir() / f"{alias.preset}.toml", [*alias.overrides(), *overrides], methods=methods
        )
        loaded.notes.insert(0, alias.note())
        return loaded
    if not file.is_file():
        state = "is a directory, not a file" if file.is_dir() else "does not exist"
        close = closest(file.name.removesuffix(".toml"), preset_names(), cutoff=0.7)
        hint = f" Did you mean the shipped preset `{close}` (`--config {close}`)?" if close else ""
        raise ConfigError(
            f"config file `{file}` {state} (resolved to {file.expanduser().resolve()}).{hint} Pass the path of a "
            "TOML preset or the name of a shipped one (`sanarl presets` lists them), e.g. `--config tiny-shapes-nft`."
        )
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file `{file}` is not UTF-8 text (byte {err.start}); TOML files must be UTF-8. Re-save it as UTF-8."
        ) from err
    except OSError as err:
        raise ConfigError(
            f"config file `{file}` cannot be read ({err.strerror}); check its permissions."
        ) from err
    return loads_config(text, overrides, source=file, methods=methods)


def loads_config(
    text: str, overrides: Sequence[str] = (), source: str | Path = "<string>", *, methods: MethodTable
) -> LoadedConfig:
    """Like `load_config` but from TOML text; `source` only names the text in messages."""
    ctx = Context(where=str(source), text=text)
    with _too_deep(f"config file `{source}`"):
        cfg = ENGINE.build(ENGINE.parse_toml(text, ctx.where), ctx)
    if isinstance(source, Path):  # relative input paths: the preset's against its file (presets.py)
        cfg = anchor_paths(cfg, anchor_dir(source))
    with _too_deep("a `--set` value"):
        cfg = apply_overrides(
            cfg, overrides, ignored=ctx.ignored, notes=ctx.notes, cosmos=ctx.dropped, given=ctx.given
        )
    if isinstance(source, Path):  # ... and --set values against the current directory
        cfg = anchor_paths(cfg, Path.cwd())
    cosmos_notes = [
        drop_in.inferred_type_note(ctx.given, ctx.dropped),
        drop_in.adapt_sft_batch(cfg, ctx.dropped),
    ]
    ctx.notes.extend(note for note in cosmos_notes if note)
    ctx.notes.extend(check_config(cfg, methods))
    resolved = Path(source).expanduser().resolve() if isinstance(source, Path) else Path(source)
    return LoadedConfig(
        config=cfg,
        ignored=_unique(ctx.ignored),
        notes=_unique(ctx.notes),
        source=resolved,
        cosmos=ctx.dropped,
        given=ctx.given,
    )


@contextlib.contextmanager
def _too_deep(what: str) -> Iterator[None]:
    """A TOML text nested hundreds of levels deep (arrays or inline tables) exhausts Python's recursion in the
    parser: bad input naming `what`, not a RecursionError traceback."""
    try:
        yield
    except RecursionError:
        raise ConfigError(
            f"{what} nests arrays or tables too deeply to read (hundreds of levels; a config needs a few): "
            "remove the nesting."
        ) from None


def apply_overrides(
    cfg: Config,
    overrides: Iterable[str],
    *,
    ignored: list[str] | None = None,
    notes: list[str] | None = None,
    cosmos: dict[str, Any] | None = None,
    given: set[str] | None = None,
) -> Config:
    """Return a copy of `cfg` with each "dotted.key=value" override applied in order (later ones win).

    Values are parsed against the field's type (the forms are in `overrides.py`). Ignored keys are appended to
    `ignored` (with their values in `cosmos`), alias notes to `notes`, the keys set to `given`.
    """
    record = Context(
        where="--set",
        ignored=[] if ignored is None else ignored,
        notes=[] if notes is None else notes,
        dropped={} if cosmos is None else cosmos,
        given=set() if given is None else given,
    )
    return apply_to(ENGINE, cfg, overrides, record)


_PASSED: dict[tuple[object, ...], list[str]] = {}
"""Configs that passed `check_config` (their repr and the method table's entries) -> their warnings: a config is
checked once, at load, and the task built from it finds it here (an edited copy is checked again)."""


def check_config(cfg: Config, methods: MethodTable) -> list[str]:
    """Cross-field validation against the method table `methods`; raises ConfigError (naming the key and the fix)
    on the first invalid setting. A config equal to one that passed against the same table is not checked again.

    Returns warnings for settings that are valid but have no effect: the method's, then the generic ones.
    """
    key = (repr(cfg), *((m.policy_type, m.trainer_type, m.validate, m.warnings) for m in methods))
    if key not in _PASSED:
        if len(_PASSED) >= 64:
            _PASSED.clear()
        _PASSED[key] = _check(cfg, methods)
    return list(_PASSED[key])


def _check(cfg: Config, methods: MethodTable) -> list[str]:
    # the Literal choices and each field's declared rules (a config built in code skipped the build's checks)
    ENGINE.check_choices(cfg)
    method = checks.check_task(cfg, methods)  # the (type, trainer_type) pair is one of `methods`: its entry
    checks.check_rewards(cfg)
    if method.validate is not None:
        method.validate(cfg)  # the method's own checks (sanarl/methods/<method>/config.py)
    checks.check_diffusers(cfg)
    checks.check_validation(cfg)
    check_components(cfg.train.components)  # imported now, as a dataset plugin is: before any model loads
    return method.warnings(cfg) + checks.warnings(cfg)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts/lists (JSON-serialisable; None values kept, e.g. for trackers), secrets
    masked (`toml_dump.mask_secrets`): what meta.json and the trackers record."""
    return toml_dump.mask_secrets(dataclasses.asdict(cfg))


def dump_toml(cfg: Config) -> str:
    """Write `cfg` as TOML text that `loads_config` reads back to an equal `Config` (the run's resolved config).

    Every section is written (defaults included), None values and absent optional tables (no LoRA) are omitted,
    lists of sections become arrays of tables.
    """
    return toml_dump.dump(cfg)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
