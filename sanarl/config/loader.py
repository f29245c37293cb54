"""Load a TOML preset into the typed `Config`, apply `--set` overrides, check it, and write it back as TOML.

Precedence: `--set` overrides > preset file > the defaults of `schema.py`.

The build is strict: every key must be a field of its section's dataclass (unknown keys raise `ConfigError` with a
did-you-mean), every value must have the field's type (an int is accepted for a float, a bool never for a number).
Keys of Cosmos-RL's schema that sanarl does not use (`cosmos_rl.NOT_APPLICABLE`, and `schema.IGNORED_KEYS`) are
accepted, dropped, listed in `LoadedConfig.ignored` and kept with their values in `LoadedConfig.cosmos`; aliases
(`schema.ALIASES`, `cosmos_rl.RENAMED`) and Cosmos-RL spellings of values (`cosmos_rl.VALUE_MAPS`) are renamed with a
note in `LoadedConfig.notes`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from sanarl.config import cosmos_rl
from sanarl.config.presets import anchor_dir, anchor_paths, resolve_preset_path
from sanarl.config.schema import ALIASES, IGNORED_KEYS, Config
from sanarl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_NoneType = type(None)


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


@dataclass
class _Ctx:
    """Where values come from (for messages) and where dropped keys and notes are recorded."""

    where: str
    ignored: list[str]
    notes: list[str]
    cosmos: dict[str, Any] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)


# --------------------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """Read the TOML preset at `path` (or the shipped preset of that name), apply `overrides` ("dotted.key=value"), check, and return the result.

    Raises `ConfigError` for a missing/unreadable file, malformed TOML (with line and column), unknown keys, wrong
    types, malformed overrides and inconsistent values (see `check_config`).
    """
    file = resolve_preset_path(path)  # a path, or the name of a shipped preset
    if not file.is_file():
        state = "is a directory, not a file" if file.is_dir() else "does not exist"
        raise ConfigError(
            f"config file `{file}` {state} (resolved to {file.expanduser().resolve()}). Pass the path of a TOML "
            "preset or the name of a shipped one (`sanarl presets` lists them), e.g. `--config tiny-shapes-nft`."
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
    return loads_config(text, overrides, source=file)


def loads_config(text: str, overrides: Sequence[str] = (), source: str | Path = "<string>") -> LoadedConfig:
    """Like `load_config` but from TOML text; `source` only names the text in messages."""
    where = str(source)
    data = _parse_toml(text, where)
    ctx = _Ctx(where=where, ignored=[], notes=[])
    cfg = _build(Config, data, "", ctx)
    if isinstance(source, Path):  # relative input paths: the preset's against its file (presets.py)
        cfg = anchor_paths(cfg, anchor_dir(source))
    cfg = apply_overrides(
        cfg, overrides, ignored=ctx.ignored, notes=ctx.notes, cosmos=ctx.cosmos, given=ctx.given
    )
    if isinstance(source, Path):  # ... and --set values against the current directory
        cfg = anchor_paths(cfg, Path.cwd())
    cosmos_notes = [
        cosmos_rl.inferred_type_note(ctx.given, ctx.cosmos),
        cosmos_rl.adapt_sft_batch(cfg, ctx.cosmos),
    ]
    ctx.notes.extend(note for note in cosmos_notes if note)
    ctx.notes.extend(check_config(cfg))
    resolved = Path(source).expanduser().resolve() if isinstance(source, Path) else Path(source)
    return LoadedConfig(
        config=cfg,
        ignored=_unique(ctx.ignored),
        notes=_unique(ctx.notes),
        source=resolved,
        cosmos=ctx.cosmos,
        given=ctx.given,
    )


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts/lists (JSON-serialisable; None values kept, e.g. for trackers)."""
    return dataclasses.asdict(cfg)


def dump_toml(cfg: Config) -> str:
    """Write `cfg` as TOML text that `loads_config` reads back to an equal `Config` (the run's resolved config).

    Every section is written (defaults included), None values and absent optional tables (no LoRA) are omitted,
    lists of sections become arrays of tables.
    """
    lines: list[str] = []
    for f in fields(cfg):
        _emit_table(getattr(cfg, f.name), f.name, lines, array=False)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# TOML parsing
# --------------------------------------------------------------------------------------------------------------

_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error becomes a ConfigError naming the file, line, column and the line itself."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        reason = str(getattr(err, "msg", None) or err)
        line, col = getattr(err, "lineno", None), getattr(err, "colno", None)
        match = _TOML_POS.search(str(err))
        if line is None and match:
            line, col = int(match.group(1)), int(match.group(2))
        reason = _TOML_POS.sub("", reason).strip()
        if line is None:
            pos, shown = "", ""
        else:
            pos = f" at line {line}, column {col}"
            lines = text.splitlines()
            shown = f" (the line reads: `{lines[line - 1].strip()}`)" if 0 < line <= len(lines) else ""
        raise ConfigError(
            f"malformed TOML in {where}{pos}: {reason}{shown}. Fix the syntax there: `key = value` pairs, "
            "`[section]` headers, strings in double quotes, arrays in brackets."
        ) from err


# --------------------------------------------------------------------------------------------------------------
# Schema introspection
# --------------------------------------------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved type of dataclass `cls`, in declaration order (schema uses postponed annotations)."""
    resolved = typing.get_type_hints(cls)
    return {f.name: resolved[f.name] for f in fields(cls) if f.init}


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _arms(tp: Any) -> tuple[list[Any], bool]:
    """The non-None members of a union (or `[tp]`) and whether None is allowed."""
    if not _is_union(tp):
        return [tp], False
    args = typing.get_args(tp)
    return [a for a in args if a is not _NoneType], _NoneType in args


def _list_item(tp: Any) -> Any | None:
    """The item type of `list[T]`, or None when `tp` is not a list type."""
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return item
    return None


def _section_cls(tp: Any) -> type | None:
    """The dataclass behind `tp` (`X`, `X | None`, `list[X]`), or None for a leaf type."""
    arms, _ = _arms(tp)
    for arm in arms:
        item = _list_item(arm)
        target = item if item is not None else arm
        if isinstance(target, type) and is_dataclass(target):
            return target
    return None


@functools.cache
def _leaf_index() -> dict[str, tuple[str, ...]]:
    """Leaf key name -> every dotted path where it is a field (for "this key belongs to [train]" hints)."""
    index: dict[str, list[str]] = {}

    def walk(cls: type, prefix: str) -> None:
        for name, tp in _hints(cls).items():
            path = f"{prefix}.{name}" if prefix else name
            index.setdefault(name, []).append(path)
            sub = _section_cls(tp)
            if sub is not None:
                walk(sub, path)

    walk(Config, "")
    return {k: tuple(v) for k, v in index.items()}


# --------------------------------------------------------------------------------------------------------------
# Ignored keys, aliases, unknown keys
# --------------------------------------------------------------------------------------------------------------


def _is_ignored(path: str) -> bool:
    """True for the keys of `schema.IGNORED_KEYS` (and their sub-keys); Cosmos-RL's keys go through `_drop_cosmos`."""
    parts = cosmos_rl.strip_indices(path).split(".")
    return any(".".join(parts[:n]) in IGNORED_KEYS for n in range(1, len(parts) + 1))


_ALIASES: dict[str, str] = {**ALIASES, **{k: v[0] for k, v in cosmos_rl.RENAMED.items()}}
"""Every accepted alias -> its canonical key."""


def _alias_note(alias: str, canonical: str, where: str) -> str:
    a_key, c_key = alias.rpartition(".")[2], canonical.rpartition(".")[2]
    why = cosmos_rl.RENAMED.get(alias, ("", ""))[1]
    return (
        f"`{a_key}` is read as `{c_key}` (`{alias}` in {where} is Cosmos-RL's spelling; sanarl's key is "
        f"`{canonical}`)." + (f" {why}." if why else "")
    )


def _apply_aliases(data: dict[str, Any], path: str, ctx: _Ctx) -> dict[str, Any]:
    """Rename alias keys of the table at `path` to their canonical names; both spellings given -> ConfigError."""
    out = dict(data)
    for alias, canonical in _ALIASES.items():
        a_parent, _, a_key = alias.rpartition(".")
        c_key = canonical.rpartition(".")[2]
        if a_parent != path or a_key not in out:
            continue
        if c_key in out and canonical in cosmos_rl.SHADOWED:  # Cosmos-RL's own key of that name means else
            ctx.ignored.append(canonical)
            ctx.cosmos[canonical] = out.pop(c_key)
        if c_key in out:
            raise ConfigError(
                f"both `{alias}` and `{canonical}` are set in {ctx.where}; they are the same setting "
                f"(`{a_key}` is Cosmos-RL's spelling). Keep only `{canonical}`."
            )
        out[c_key] = out.pop(a_key)
        ctx.notes.append(_alias_note(alias, canonical, ctx.where))
    return out


def _section_label(path: str, cls: type) -> str:
    if not path:
        return "valid top-level sections"
    array = re.sub(r"\[\d+\]$", "", path)
    if array != path:
        return f"valid keys of [[{array}]]"
    return f"valid keys of [{path}]"


def _unknown_key(key: str, path: str, cls: type, where: str) -> ConfigError:
    """The did-you-mean error for `key`, unknown in the section `cls` at dotted `path`."""
    names = list(_hints(cls))
    dotted = f"{path}.{key}" if path else key
    prefix = f"{path}." if path else ""
    close = difflib.get_close_matches(key, names + cosmos_rl.known_children(path), n=1, cutoff=0.6)
    if close:
        hint = f"; did you mean `{prefix}{close[0]}`?"
    elif key in _leaf_index():
        homes = " or ".join(f"`{p}`" for p in _leaf_index()[key])
        hint = f"; `{key}` belongs elsewhere: did you mean {homes}?"
    else:
        hint = ""
    return ConfigError(
        f"unknown key `{dotted}` in {where}{hint} ({_section_label(path, cls)}: {', '.join(names)}). "
        "Fix its spelling or remove it."
    )


# --------------------------------------------------------------------------------------------------------------
# Building dataclasses from TOML values
# --------------------------------------------------------------------------------------------------------------

_ARTICLE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}
_PLURAL_NAMES = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _describe(tp: Any, override: bool = False) -> str:
    """Human name of a schema type for messages, e.g. `an array of integers`, `a number or none`."""
    arms, optional = _arms(tp)
    parts = []
    for arm in arms:
        item = _list_item(arm)
        if item is not None:
            is_table = isinstance(item, type) and is_dataclass(item)
            parts.append("an array of tables" if is_table else f"an array of {_PLURAL_NAMES.get(item, item)}")
        elif isinstance(arm, type) and is_dataclass(arm):
            parts.append("a table")
        else:
            parts.append(_ARTICLE_NAMES.get(arm, str(arm)))
    text = " or ".join(parts)
    if optional:
        text += " or none" if override else " (leave the key out for none)"
    return text


def _kind(value: Any) -> str:
    """TOML name of a parsed value's type."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def _type_error(key: str, tp: Any, value: Any, where: str, override: bool = False) -> ConfigError:
    shown = f"`{value}`" if override and isinstance(value, str) else f"{value!r} ({_kind(value)})"
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    extra = (
        " (an integer is accepted for a number; true/false are not numbers)" if float in _arms(tp)[0] else ""
    )
    return ConfigError(
        f"wrong type for `{key}` in {where}: expected {_describe(tp, override)}{extra}, got {shown}. "
        f"Change the value of `{key}`."
    )


def _shallow_match(value: Any, tp: Any) -> bool:
    """Does `value` (as parsed by TOML) have the outer kind of `tp`? Nested items are checked by `_coerce`."""
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if _list_item(tp) is not None:
        return isinstance(value, list)
    if typing.get_origin(tp) is dict:
        return isinstance(value, dict)
    if isinstance(tp, type) and is_dataclass(tp):
        return isinstance(value, dict)
    return False


def _coerce(value: Any, tp: Any, key: str, ctx: _Ctx, override: bool = False) -> Any:
    """Check `value` against the schema type `tp` and convert it (int -> float, tables -> dataclasses)."""
    arms, _ = _arms(tp)
    arm = next((a for a in arms if _shallow_match(value, a)), None)
    if arm is None:
        raise _type_error(key, tp, value, ctx.where, override)
    item = _list_item(arm)
    if item is not None:
        return [_coerce(v, item, f"{key}[{i}]", ctx, override) for i, v in enumerate(value)]
    if is_dataclass(arm):
        return _build(arm, value, key, ctx)
    if arm is float:
        return float(value)
    return value


def _build(cls: type, data: Any, path: str, ctx: _Ctx) -> Any:
    """Instantiate dataclass `cls` from the TOML table `data` found at dotted `path` (strict: unknown keys raise)."""
    if not isinstance(data, dict):
        raise _type_error(path, cls, data, ctx.where)
    data = _apply_aliases(data, path, ctx)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else key
        if key not in hints and _drop_cosmos(dotted, value, ctx):
            continue
        if _is_ignored(dotted):
            ctx.ignored.append(dotted)
            continue
        if key not in hints:
            raise _unknown_key(key, path, cls, ctx.where)
        kwargs[key] = _coerce(_cosmos_value(dotted, value, ctx), hints[key], dotted, ctx)
        ctx.given.add(dotted)
    return cls(**kwargs)


def _cosmos_value(dotted: str, value: Any, ctx: _Ctx) -> Any:
    """`value` with Cosmos-RL's spelling mapped to sanarl's (`cosmos_rl.VALUE_MAPS`), noted; refused ones raise."""
    try:
        new, note = cosmos_rl.map_value(dotted, value)
    except ValueError as err:
        raise ConfigError(f"{err} ({ctx.where})") from None
    if note:
        ctx.notes.append(f"{note[:-1]} ({ctx.where}).")
    return new


def _drop_cosmos(dotted: str, value: Any, ctx: _Ctx) -> bool:
    """Drop (and record) a Cosmos-RL key sanarl does not use; False when `dotted` is not one of Cosmos-RL's keys.

    A not-applicable Cosmos-RL table is walked so that its keys are checked against Cosmos-RL's schema too.
    """
    if cosmos_rl.is_table(dotted):
        array = cosmos_rl.strip_indices(dotted) in cosmos_rl.ARRAY_TABLES and isinstance(value, list)
        for i, item in enumerate(value if array else [value]):
            where = f"{dotted}[{i}]" if array else dotted
            if not isinstance(item, dict):
                raise ConfigError(
                    f"wrong type for `{where}` in {ctx.where}: expected a table (Cosmos-RL's "
                    f"[{cosmos_rl.strip_indices(where)}] section), got {item!r} ({_kind(item)}). Make it a table."
                )
            known = cosmos_rl.known_children(dotted)
            for key, sub in item.items():
                if key not in known or not _drop_cosmos(f"{where}.{key}", sub, ctx):
                    raise _unknown_cosmos_key(key, where, known, ctx.where)
        return True
    if cosmos_rl.treatment(dotted) is None:
        parent, _, key = dotted.rpartition(".")
        if parent and cosmos_rl.is_table(parent) and not _in_schema(parent):
            raise _unknown_cosmos_key(key, parent, cosmos_rl.known_children(parent), ctx.where)
        return False
    try:
        cosmos_rl.check_choice(dotted, value)
    except ValueError as err:
        raise ConfigError(
            f"{err} ({ctx.where}); fix the value or remove the key (sanarl does not use it)."
        ) from None
    ctx.ignored.append(dotted)
    ctx.cosmos[dotted] = value
    return True


def _unknown_cosmos_key(key: str, path: str, known: list[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean `{path}.{close[0]}`?" if close else ""
    return ConfigError(
        f"unknown key `{path}.{key}` in {where}{hint} (valid keys of [{cosmos_rl.strip_indices(path)}], a Cosmos-RL "
        f"table that sanarl accepts and does not use: {', '.join(known)}). Fix its spelling or remove it."
    )


# --------------------------------------------------------------------------------------------------------------
# --set overrides
# --------------------------------------------------------------------------------------------------------------

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


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

    Values are parsed against the field's type: bool true/false/1/0/yes/no/on/off; numbers as Python literals;
    lists as a TOML inline array (`[1, 2]`) or comma-separated (`console,wandb`); "none"/"null" for optional fields;
    a TOML inline table (`{r = 8}`) for a whole section. Setting a key inside an absent optional section
    (`policy.lora.r=8` without `[policy.lora]`) creates that section with its defaults first. Ignored keys are
    appended to `ignored` (with their values in `cosmos`), alias notes to `notes`.
    """
    out = copy.deepcopy(cfg)
    ignored = [] if ignored is None else ignored
    notes = [] if notes is None else notes
    cosmos = {} if cosmos is None else cosmos
    given = set() if given is None else given
    for item in overrides:
        key, raw = _split_override(item)
        ctx = _Ctx(where=f"--set `{item}`", ignored=ignored, notes=notes, cosmos=cosmos, given=given)
        if key in _ALIASES:
            notes.append(_alias_note(key, _ALIASES[key], ctx.where))
            key = _ALIASES[key]
        if not _in_schema(key) and _drop_cosmos(key, _raw_value(raw), ctx):
            continue
        if _is_ignored(key):
            ignored.append(key)
            continue
        _set_path(out, key, raw, ctx)
    return out


def _in_schema(key: str) -> bool:
    """Whether the dotted `key` (list indices as numbers) names a field of sanarl's schema."""
    cls: Any = Config
    for part in cosmos_rl.strip_indices(key).split("."):
        if part.isdigit():
            continue
        if cls is None or part not in _hints(cls):
            return False
        cls = _section_cls(_hints(cls)[part])
    return True


def _raw_value(raw: str) -> Any:
    """An override's text as a TOML value when it parses as one (`1`, `true`, `[1, 2]`, `{a = 1}`), else the text."""
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()


def _split_override(item: str) -> tuple[str, str]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", key):
        raise ConfigError(
            f"malformed override `{item}`: expected the form `dotted.key=value`, e.g. "
            "`--set train.optm_lr=1e-4` or `--set policy.lora.r=8` (keys as in the preset's sections)."
        )
    return key, raw


def _set_path(cfg: Config, key: str, raw: str, ctx: _Ctx) -> None:
    """Walk `key` through the dataclass tree of `cfg` and set its last component from the override text `raw`."""
    parts = key.split(".")
    obj: Any = cfg
    path = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(obj, list):
            index = _list_index(obj, part, path, ctx)
            path = f"{path}[{index}]"
            if last:
                obj[index] = _parse_override(raw, _section_type_of_list(obj), path, ctx)
                return
            obj = obj[index]
            continue
        hints = _hints(type(obj))
        if part not in hints:
            raise _unknown_key(part, path, type(obj), ctx.where)
        dotted = f"{path}.{part}" if path else part
        if last:
            setattr(obj, part, _cosmos_value(dotted, _parse_override(raw, hints[part], dotted, ctx), ctx))
            ctx.given.add(dotted)
            return
        obj = _descend(obj, part, hints[part], dotted, ctx)
        path = dotted


def _descend(obj: Any, name: str, tp: Any, dotted: str, ctx: _Ctx) -> Any:
    """The section (or list of sections) in field `name` of `obj`; an absent optional section is created."""
    sub = _section_cls(tp)
    if sub is None:
        raise ConfigError(
            f"`{dotted}` in {ctx.where} is a value ({_describe(tp)}), not a section, so it has no sub-keys; "
            f"set it directly, e.g. `--set {dotted}=...`."
        )
    value = getattr(obj, name)
    if value is None:
        value = sub()
        setattr(obj, name, value)
    return value


def _list_index(items: list[Any], part: str, path: str, ctx: _Ctx) -> int:
    if not part.isdigit() or int(part) >= len(items):
        valid = f"an integer from 0 to {len(items) - 1}" if items else "impossible (the array is empty)"
        raise ConfigError(
            f"`{path}.{part}` in {ctx.where}: `{path}` has {len(items)} entries, so the index must be {valid}; "
            "add entries as [[...]] tables in the preset file to set more."
        )
    return int(part)


def _section_type_of_list(items: list[Any]) -> Any:
    return type(items[0])


def _parse_override(raw: str, tp: Any, key: str, ctx: _Ctx) -> Any:
    """Parse the override text `raw` as a value of schema type `tp` (see `apply_overrides` for the forms)."""
    text = raw.strip()
    arms, optional = _arms(tp)
    if optional and text.lower() in ("none", "null"):
        return None
    has_list = any(_list_item(a) is not None for a in arms)
    if _section_cls(tp) is not None or (has_list and text.startswith("[")):
        return _coerce(_inline_toml(text, tp, key, ctx), tp, key, ctx, override=True)
    if len(arms) > 1:  # bool | str: true/false are booleans, anything else is a string
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        return _parse_scalar(raw, str, tp, key, ctx)
    arm = arms[0]
    item = _list_item(arm)
    if item is not None:
        pieces = [] if not text else [p.strip() for p in text.split(",")]
        return [_parse_scalar(p, item, tp, f"{key}[{i}]", ctx) for i, p in enumerate(pieces)]
    return _parse_scalar(raw, arm, tp, key, ctx)


def _parse_scalar(raw: str, arm: Any, tp: Any, key: str, ctx: _Ctx) -> Any:
    """Parse one bool/int/float/str from override text; failures name the key and the expected type."""
    text = raw.strip()
    if arm is str:
        if text[:1] in ('"', "'") and len(text) >= 2 and text[-1] == text[0]:
            return _inline_toml(text, tp, key, ctx)
        return text
    low = text.lower()
    if arm is bool and low in _TRUE | _FALSE:
        return low in _TRUE
    if arm is int and re.fullmatch(r"[+-]?\d[\d_]*", text):
        return int(text)
    if arm is float and low not in ("", "true", "false"):
        try:
            return float(text)
        except ValueError:
            pass
    raise _type_error(key, tp, raw, ctx.where, override=True)


def _inline_toml(text: str, tp: Any, key: str, ctx: _Ctx) -> Any:
    """Parse `text` as one TOML value (inline array, inline table or quoted string)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(
            f"cannot parse the value of `{key}` in {ctx.where} as TOML ({err}); expected {_describe(tp, True)}, "
            'e.g. `[1, 2]`, `{r = 8}` or `"text"` (quote the whole --set argument for your shell).'
        ) from err


# --------------------------------------------------------------------------------------------------------------
# Cross-field checks
# --------------------------------------------------------------------------------------------------------------

_TRAINERS = {"sft": ("", "soar"), "grpo": ("diffusion_nft", "flow_grpo")}
_SOLVERS = ("euler", "dpm2", "flow_sde", "cps")
_ODE_SOLVERS = ("euler", "dpm2")
_WEIGHTINGS = ("logit_normal", "mode", "uniform", "sigma_sqrt", "cosmap")
_DTYPES = ("float32", "bfloat16", "float16")
_LOGGERS = ("console", "wandb", "tensorboard")
_OPTIMIZERS = ("AdamW", "Adam", "SGD")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(value: Any, key: str, allowed: Sequence[Any]) -> None:
    shown = ", ".join(repr(a) if isinstance(a, str) else str(a) for a in allowed)
    hint = ""
    if isinstance(value, str):
        names = [str(a) for a in allowed]
        same_case = [n for n in names if n.lower() == value.lower()]
        close = same_case or difflib.get_close_matches(value, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    _require(value in allowed, f"`{key}` = {value!r} is not supported{hint}; set it to one of {shown}.")


def _at_least(value: float, key: str, low: float, strict: bool = False) -> None:
    ok = value > low if strict else value >= low
    bound = f"> {low}" if strict else f">= {low}"
    _require(ok and not math.isnan(value), f"`{key}` = {value!r} is out of range; it must be {bound}.")


def _in_unit(value: float, key: str, low_open: bool, high_open: bool) -> None:
    ok = (value > 0 if low_open else value >= 0) and (value < 1 if high_open else value <= 1)
    interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
    _require(ok, f"`{key}` = {value!r} is out of range; it must lie in {interval}.")


def check_config(cfg: Config) -> list[str]:
    """Cross-field validation; raises ConfigError (naming the key and the fix) on the first invalid setting.

    Returns warnings for settings that are valid but have no effect.
    """
    _check_task(cfg)
    _check_grpo(cfg)
    _check_lora(cfg)
    _check_diffusers(cfg)
    _check_optimizer(cfg)
    _check_run(cfg)
    return _warnings(cfg)


def _check_task(cfg: Config) -> None:
    tp = cfg.train.train_policy
    _one_of(tp.type, "train.train_policy.type", tuple(_TRAINERS))
    _require(
        tp.trainer_type in _TRAINERS[tp.type],
        f"`train.train_policy.trainer_type` = {tp.trainer_type!r} is not valid for type = {tp.type!r}; set it to "
        f"one of {', '.join(repr(t) for t in _TRAINERS[tp.type])}"
        + (' ("" = plain SFT).' if tp.type == "sft" else "."),
    )
    _at_least(tp.mini_batch, "train.train_policy.mini_batch", 1)
    _at_least(cfg.train.train_batch_per_replica, "train.train_batch_per_replica", 1)
    batch, mini = cfg.train.train_batch_per_replica, tp.mini_batch
    examples = " or ".join(str(m) for m in (batch // mini * mini, (batch // mini + 1) * mini) if m > 0)
    _require(
        batch % mini == 0,
        f"train.train_batch_per_replica = {batch} is not a multiple of train.train_policy.mini_batch = {mini}; "
        f"set train.train_batch_per_replica to a multiple of {mini} (e.g. {examples}) or choose a mini_batch "
        f"that divides {batch}.",
    )
    _at_least(tp.kl_beta, "train.train_policy.kl_beta", 0)
    _require(
        tp.advantage_low < tp.advantage_high,
        f"train.train_policy.advantage_low = {tp.advantage_low} must be below advantage_high = {tp.advantage_high};"
        " set e.g. advantage_low = -5.0 and advantage_high = 5.0.",
    )
    _check_rewards(cfg)


def _check_rewards(cfg: Config) -> None:
    rr = cfg.train.train_policy.remote_reward
    base = "train.train_policy.remote_reward"
    for i, fn in enumerate(rr.reward_fns):
        _require(
            bool(fn.name.strip()),
            f"`{base}.reward_fns[{i}].name` is empty; give each [[{base}.reward_fns]] entry a reward name, "
            'e.g. name = "pickscore".',
        )
        if fn.clip_min is not None and fn.clip_max is not None:
            _require(
                fn.clip_min < fn.clip_max,
                f"`{base}.reward_fns[{i}]` ({fn.name}): clip_min = {fn.clip_min} must be below clip_max = "
                f"{fn.clip_max}; fix or remove one of them.",
            )
    _at_least(rr.video_frame_stride, f"{base}.video_frame_stride", 1)
    _one_of(rr.video_frame_reduction, f"{base}.video_frame_reduction", ("mean", "min", "max", "median"))
    if rr.reward_clip_min is not None and rr.reward_clip_max is not None:
        _require(
            rr.reward_clip_min < rr.reward_clip_max,
            f"`{base}.reward_clip_min` = {rr.reward_clip_min} must be below reward_clip_max = "
            f"{rr.reward_clip_max}; fix or remove one of them.",
        )


def _check_grpo(cfg: Config) -> None:
    tp = cfg.train.train_policy
    if tp.type != "grpo":
        return
    k, batch = cfg.rollout.n_generation, cfg.train.train_batch_per_replica
    _at_least(k, "rollout.n_generation", 2)
    _require(
        batch % k == 0,
        f"train.train_batch_per_replica = {batch} is not a multiple of rollout.n_generation = {k} (the group "
        f"size); set train.train_batch_per_replica to a multiple of {k} or choose an n_generation that divides it.",
    )
    _at_least(cfg.rollout.batch_size, "rollout.batch_size", 1)
    _one_of(cfg.rollout.backend, "rollout.backend", ("diffusers",))
    _require(
        len(tp.remote_reward.reward_fns) > 0,
        "train.train_policy.type = 'grpo' needs a reward: add at least one "
        '[[train.train_policy.remote_reward.reward_fns]] table with name = "..." and weight = 1.0.',
    )
    sample = cfg.policy.diffusers.sample
    if tp.trainer_type == "flow_grpo":
        _require(
            sample.solver in ("flow_sde", "cps") and sample.noise_level > 0,
            f"flow_grpo needs stochastic rollouts with log-probabilities, but policy.diffusers.sample.solver = "
            f"{sample.solver!r} and noise_level = {sample.noise_level}; set solver = 'flow_sde' (or 'cps') and "
            "noise_level > 0 (e.g. 0.7).",
        )
    if tp.trainer_type == "diffusion_nft":
        _at_least(cfg.policy.diffusers.nft_beta, "policy.diffusers.nft_beta", 0, strict=True)
        # exactness (issue 16): DiffusionNFT clips symmetrically at C = advantage_high; a lower bound is not honoured
        _require(
            tp.advantage_low == -tp.advantage_high,
            f"train.train_policy.advantage_low = {tp.advantage_low} has no effect for diffusion_nft, which clips "
            f"advantages to [-C, C] with C = advantage_high = {tp.advantage_high} (DiffusionNFT's adv_clip_max); "
            f"set advantage_low = {-tp.advantage_high} (or use adv_mode = 'positive_only' for A >= 0).",
        )
    _check_rollout_family(cfg)
    _one_of(
        tp.adv_mode,
        "train.train_policy.adv_mode",
        ("all", "positive_only", "negative_only", "one_only", "binary"),
    )
    _require(
        tp.advantage_high > 0,
        f"train.train_policy.advantage_high = {tp.advantage_high} must be > 0 (it is DiffusionNFT's adv_clip_max C).",
    )


def _check_rollout_family(cfg: Config) -> None:
    ro = cfg.rollout
    _one_of(
        ro.family, "rollout.family", ("diffusionnft", "naive_scaling", "compile", "naive_quant", "sol_rl")
    )
    _one_of(ro.selection, "rollout.selection", ("best_worst", "random", "mean_deviation", "extremes_random"))
    _one_of(ro.preview_precision, "rollout.preview_precision", ("nvfp4", "fp8", "int8", "auto", "bf16"))
    _at_least(ro.reward_workers, "rollout.reward_workers", 0)
    _at_least(ro.reward_deadline_s, "rollout.reward_deadline_s", 0, strict=True)
    m, k = ro.num_candidates, ro.n_generation
    if ro.family != "diffusionnft":
        _require(
            m >= k,
            f"rollout.family = {ro.family!r} searches over rollout.num_candidates = M drafts per prompt and keeps "
            f"rollout.n_generation = {k}; set num_candidates >= {k} (Sol-RL uses 4 x K, e.g. {4 * k}).",
        )
    if ro.family == "sol_rl":
        steps = cfg.policy.diffusers.sample.num_steps
        _require(
            1 <= ro.preview_step <= steps,
            f"rollout.preview_step = {ro.preview_step} must be between 1 and policy.diffusers.sample.num_steps = "
            f"{steps} (Sol-RL previews at 6 of 10 steps).",
        )


def _check_lora(cfg: Config) -> None:
    lora = cfg.policy.lora
    if lora is None:
        return
    _at_least(lora.r, "policy.lora.r", 1)
    _at_least(lora.lora_alpha, "policy.lora.lora_alpha", 0, strict=True)
    _in_unit(lora.lora_dropout, "policy.lora.lora_dropout", low_open=False, high_open=True)
    names = lora.lora_names
    _require(
        "default" in names and len(set(names)) == len(names),
        f'`policy.lora.lora_names` = {names!r} must contain "default" (the trained adapter) with no duplicates; '
        'set lora_names = ["default"] (SFT) or ["default", "old"] (DiffusionNFT).',
    )
    tp = cfg.train.train_policy
    if tp.type == "grpo" and tp.trainer_type == "diffusion_nft":
        _require(
            "old" in names,
            f'`policy.lora.lora_names` = {names!r} lacks "old": DiffusionNFT keeps its behaviour policy in an '
            'adapter named "old"; set lora_names = ["default", "old"].',
        )


def _check_diffusers(cfg: Config) -> None:
    d = cfg.policy.diffusers
    _in_unit(d.timesteps_fraction, "policy.diffusers.timesteps_fraction", low_open=True, high_open=False)
    _require(
        len(d.inference_size) == 2 and all(v > 0 for v in d.inference_size),
        f"`policy.diffusers.inference_size` = {d.inference_size!r} must be [height, width] with two positive "
        "integers, e.g. [1024, 1024].",
    )
    _one_of(d.weighting_scheme, "policy.diffusers.weighting_scheme", _WEIGHTINGS)
    _one_of(d.dtype, "policy.diffusers.dtype", _DTYPES)
    _in_unit(d.caption_dropout, "policy.diffusers.caption_dropout", low_open=False, high_open=False)
    _one_of(d.vae_latents, "policy.diffusers.vae_latents", ("sample", "mode"))
    _one_of(d.weight_copy_decay_type, "policy.diffusers.weight_copy_decay_type", (0, 1, 2))
    _at_least(d.logit_std, "policy.diffusers.logit_std", 0, strict=True)
    _at_least(d.max_prompt_length, "policy.diffusers.max_prompt_length", 1)
    if d.is_video:
        _at_least(d.train_frames, "policy.diffusers.train_frames", 1)
        _at_least(d.inference_frames, "policy.diffusers.inference_frames", 1)
    s = d.sample
    _one_of(s.solver, "policy.diffusers.sample.solver", _SOLVERS)
    if s.eval_solver is not None:
        _one_of(s.eval_solver, "policy.diffusers.sample.eval_solver", _ODE_SOLVERS)
    _at_least(s.num_steps, "policy.diffusers.sample.num_steps", 1)
    _at_least(s.eval_num_steps, "policy.diffusers.sample.eval_num_steps", 1)
    _at_least(s.guidance_scale, "policy.diffusers.sample.guidance_scale", 0)
    _at_least(s.noise_level, "policy.diffusers.sample.noise_level", 0)
    if s.flow_shift is not None:
        _at_least(s.flow_shift, "policy.diffusers.sample.flow_shift", 0, strict=True)


def _check_optimizer(cfg: Config) -> None:
    t = cfg.train
    _one_of(t.optm_name, "train.optm_name", _OPTIMIZERS)
    _at_least(t.optm_lr, "train.optm_lr", 0, strict=True)
    _require(
        len(t.optm_betas) == 2 and all(0 <= b < 1 for b in t.optm_betas),
        f"`train.optm_betas` = {t.optm_betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.999].",
    )
    _at_least(t.optm_weight_decay, "train.optm_weight_decay", 0)
    _at_least(t.optm_grad_norm_clip, "train.optm_grad_norm_clip", 0)
    _at_least(t.optm_warmup_steps, "train.optm_warmup_steps", 0)
    _at_least(t.epsilon, "train.epsilon", 0, strict=True)
    _in_unit(t.ema_decay, "train.ema_decay", low_open=False, high_open=True)
    _at_least(t.ema_update_step_interval, "train.ema_update_step_interval", 1)
    _one_of(t.param_dtype, "train.param_dtype", _DTYPES)


def _check_run(cfg: Config) -> None:
    t = cfg.train
    _require(cfg.policy.is_diffusers, "`policy.is_diffusers` = false is not supported; set it to true.")
    _require(
        bool(cfg.policy.model_name_or_path.strip()),
        '`policy.model_name_or_path` is empty; set a hub id, a local pipeline dir or "sanarl-tiny:shapes".',
    )
    _at_least(t.epoch, "train.epoch", 1)
    if t.max_num_steps is not None:
        _at_least(t.max_num_steps, "train.max_num_steps", 1)
    if t.max_wall_minutes is not None:
        _at_least(t.max_wall_minutes, "train.max_wall_minutes", 0.0, strict=True)
    _require(
        bool(t.output_dir.strip()), '`train.output_dir` is empty; set a run directory, e.g. "./outputs/run".'
    )
    _at_least(t.ckpt.save_freq, "train.ckpt.save_freq", 1)
    _at_least(t.ckpt.max_keep, "train.ckpt.max_keep", 0)
    if t.ckpt.save_every_minutes is not None:
        _at_least(t.ckpt.save_every_minutes, "train.ckpt.save_every_minutes", 0.0, strict=True)
    v = cfg.validation
    _at_least(v.freq, "validation.freq", 1)
    _at_least(v.batch_size, "validation.batch_size", 1)
    _at_least(v.num_samples, "validation.num_samples", 1)
    v.guard.check(v)  # [validation.guard]: its checks sit beside its fields (schema.GuardConfig.check)
    for i, name in enumerate(cfg.logging.logger):
        _one_of(name, f"logging.logger[{i}]", _LOGGERS)
    _at_least(cfg.logging.log_freq, "logging.log_freq", 1)


def _warnings(cfg: Config) -> list[str]:
    """Valid settings that have no effect in this task."""
    tp = cfg.train.train_policy
    out = []
    if tp.type == "sft" and tp.kl_beta > 0:
        out.append(f"train.train_policy.kl_beta = {tp.kl_beta} has no effect for SFT; it is ignored.")
    if tp.type == "sft" and (tp.use_remote_reward or tp.remote_reward.reward_fns):
        out.append(
            "train.train_policy.remote_reward / use_remote_reward have no effect for SFT; they are ignored."
        )
    if tp.trainer_type == "flow_grpo" and cfg.policy.diffusers.sample.deterministic_sampling:
        out.append(
            "policy.diffusers.sample.deterministic_sampling = true has no effect for flow_grpo, whose rollouts "
            "always use the stochastic `solver`."
        )
    if cfg.validation.val_before_train and not cfg.validation.enable:
        out.append("validation.val_before_train = true has no effect while validation.enable = false.")
    return out


# --------------------------------------------------------------------------------------------------------------
# TOML writing
# --------------------------------------------------------------------------------------------------------------

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    """A bare TOML key when possible, else a quoted one."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    """One inline TOML value (bool, int, float, str, or a list / inline table of those)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")


def _emit_table(obj: Any, path: str, lines: list[str], array: bool) -> None:
    """Append `[path]` (or `[[path]]`) with the scalar fields of dataclass `obj`, then its sub-sections."""
    if lines:
        lines.append("")
    lines.append(f"[[{path}]]" if array else f"[{path}]")
    tables: list[tuple[str, Any]] = []
    arrays: list[tuple[str, list[Any]]] = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        if is_dataclass(value):
            tables.append((f.name, value))
        elif isinstance(value, list) and value and all(is_dataclass(v) for v in value):
            arrays.append((f.name, value))
        else:
            lines.append(f"{f.name} = {_toml_value(value)}")
    for name, value in tables:
        _emit_table(value, f"{path}.{name}", lines, array=False)
    for name, items in arrays:
        for item in items:
            _emit_table(item, f"{path}.{name}", lines, array=True)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
