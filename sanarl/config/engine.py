"""The strict TOML -> dataclass engine shared by the trainer config (`loader.py`) and the reward service's
(`reward_service/config.py`).

It knows nothing of either schema: it reads the field types of whatever dataclass it is given. The build is
strict: every key must be a field of its section's dataclass (unknown keys raise `ConfigError` with a
did-you-mean), every value must have the field's type (an int is accepted for a float, a bool never for a
number), and a `typing.Literal` field takes only its values. An error about a key of a file quotes the line that
sets it (`key_line`; tomllib itself locates syntax errors only). What differs between the two configs plugs in:

- `Hooks`: keys accepted outside the schema and dropped (the trainer's Cosmos-RL keys), renamed keys, mapped
  values; the defaults accept nothing extra.
- `Messages`: the wording of the errors; the defaults are the trainer's, the reward service words its own.

`--set` overrides are in `overrides.py`, the TOML writer in `toml_dump.py`.
"""

from __future__ import annotations

import functools
import re
import sys
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from sanarl.config.suggest import closest
from sanarl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_NoneType = type(None)


@dataclass
class Context:
    """Where values come from (for messages) and what the hooks recorded on the way."""

    where: str
    ignored: list[str] = field(default_factory=list)
    """Dotted paths of keys accepted and dropped."""
    notes: list[str] = field(default_factory=list)
    """Notes of renamed keys and mapped values."""
    dropped: dict[str, Any] = field(default_factory=dict)
    """Dropped keys -> their values."""
    given: set[str] = field(default_factory=set)
    """Dotted paths (list indices as `[i]`) of the schema keys that were set."""
    text: str = ""
    """The TOML text being built (a file's): errors about a key then name its line."""


# --------------------------------------------------------------------------------------------------------------
# Schema introspection
# --------------------------------------------------------------------------------------------------------------


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved type of dataclass `cls`, in declaration order (postponed annotations resolved).

    Fields with `init=False` or `metadata={"internal": True}` are not keys of the file.
    """
    resolved = typing.get_type_hints(cls)
    return {f.name: resolved[f.name] for f in fields(cls) if f.init and not f.metadata.get("internal")}


@functools.cache
def field_rules(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> the rules declared in its `Annotated[T, rule, ...]` type (objects with `check(value, key)`,
    e.g. `ranges.Range`); fields without any are absent."""
    resolved = typing.get_type_hints(cls, include_extras=True)
    rules = {}
    for name in field_types(cls):
        tp = resolved[name]
        if typing.get_origin(tp) is typing.Annotated:
            found = tuple(m for m in tp.__metadata__ if callable(getattr(m, "check", None)))
            if found:
                rules[name] = found
    return rules


def is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def arms(tp: Any) -> tuple[list[Any], bool]:
    """The non-None members of a union (or `[tp]`) and whether None is allowed."""
    if not is_union(tp):
        return [tp], False
    args = typing.get_args(tp)
    return [a for a in args if a is not _NoneType], _NoneType in args


def list_item(tp: Any) -> Any | None:
    """The item type of `list[T]`, or None when `tp` is not a list type."""
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return item
    return None


def choices(tp: Any) -> tuple[Any, ...] | None:
    """The values of a `Literal[...]` type, or None for any other type."""
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def base_type(tp: Any) -> Any:
    """The value type behind `tp`: `str` for `Literal["a", "b"]`, `int` for `Literal[0, 1]`, else `tp` itself."""
    values = choices(tp)
    return type(values[0]) if values else tp


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)


def section_class(tp: Any) -> type | None:
    """The dataclass behind `tp` (`X`, `X | None`, `list[X]`), or None for a leaf type."""
    for arm in arms(tp)[0]:
        item = list_item(arm)
        target = item if item is not None else arm
        if is_section(target):
            return target
    return None


@functools.cache
def leaf_index(root: type) -> dict[str, tuple[str, ...]]:
    """Key name -> every dotted path under `root` where it is a field (for "this key belongs to [x]" hints)."""
    index: dict[str, list[str]] = {}

    def walk(cls: type, prefix: str) -> None:
        for name, tp in field_types(cls).items():
            path = f"{prefix}.{name}" if prefix else name
            index.setdefault(name, []).append(path)
            sub = section_class(tp)
            if sub is not None:
                walk(sub, path)

    walk(root, "")
    return {k: tuple(v) for k, v in index.items()}


def in_schema(root: type, key: str) -> bool:
    """Whether the dotted `key` (list indices as numbers or `[i]`) names a field under `root`."""
    cls: Any = root
    for part in re.sub(r"\[\d+\]", "", key).split("."):
        if part.isdigit():
            continue
        if cls is None or part not in field_types(cls):
            return False
        cls = section_class(field_types(cls)[part])
    return True


# --------------------------------------------------------------------------------------------------------------
# Plug-ins: hooks and messages
# --------------------------------------------------------------------------------------------------------------


class Hooks:
    """What a config accepts beyond its schema; the defaults accept nothing and change nothing."""

    def rename_keys(self, data: dict[str, Any], path: str, ctx: Context) -> dict[str, Any]:
        """The table `data` at dotted `path` with alias keys renamed to the schema's names."""
        return data

    def rename_key(self, key: str, ctx: Context) -> str:
        """The dotted `key` of an override, an alias renamed to the schema's name."""
        return key

    def drop(self, dotted: str, value: Any, ctx: Context) -> bool:
        """Accept (and record in `ctx`) a key that is not in the schema; False = it is unknown."""
        return False

    def map_value(self, dotted: str, value: Any, ctx: Context) -> Any:
        """The value of schema key `dotted` in the schema's terms (before its choices are checked)."""
        return value

    def more_names(self, path: str) -> list[str]:
        """Further keys accepted in the table at `path`, offered by the did-you-mean."""
        return []


_ARTICLE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}
_PLURAL_NAMES = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")


def describe(tp: Any, override: bool = False) -> str:
    """Human name of a schema type for messages, e.g. `an array of integers`, `a number or none`."""
    members, optional = arms(tp)
    parts = []
    for arm in members:
        item = list_item(arm)
        if item is not None:
            kind = "tables" if is_section(item) else _PLURAL_NAMES.get(base_type(item), item)
            parts.append(f"an array of {kind}")
        elif is_section(arm):
            parts.append("a table")
        else:
            parts.append(_ARTICLE_NAMES.get(base_type(arm), str(arm)))
    text = " or ".join(parts)
    if optional:
        text += " or none" if override else " (leave the key out for none)"
    return text


def toml_kind(value: Any) -> str:
    """TOML name of a parsed value's type."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def section_label(path: str) -> str:
    """`valid keys of [a.b]` / `[[a.b]]` for an array item / `valid top-level sections` for the root."""
    if not path:
        return "valid top-level sections"
    array = re.sub(r"\[\d+\]$", "", path)
    if array != path:
        return f"valid keys of [[{array}]]"
    return f"valid keys of [{path}]"


class Messages:
    """The errors of a build; each method returns the `ConfigError` to raise."""

    def malformed_toml(self, where: str, err: tomllib.TOMLDecodeError, text: str) -> ConfigError:
        """A TOML syntax error: the file, line, column and the line itself."""
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
        return ConfigError(
            f"malformed TOML in {where}{pos}: {reason}{shown}. Fix the syntax there: `key = value` pairs, "
            "`[section]` headers, strings in double quotes, arrays in brackets."
        )

    def unknown_key(
        self, key: str, path: str, names: list[str], root: type, where: str, more: list[str]
    ) -> ConfigError:
        """`key` is no field of the table at `path` (whose fields are `names`); `more` are other accepted keys."""
        dotted = f"{path}.{key}" if path else key
        prefix = f"{path}." if path else ""
        close = closest(key, names + more)
        homes = leaf_index(root).get(key)
        if close:
            hint = f"; did you mean `{prefix}{close}`?"
        elif homes:
            hint = f"; `{key}` belongs elsewhere: did you mean {' or '.join(f'`{p}`' for p in homes)}?"
        else:
            hint = ""
        return ConfigError(
            f"unknown key `{dotted}` in {where}{hint} ({section_label(path)}: {', '.join(names)}). "
            "Fix its spelling or remove it."
        )

    def wrong_type(self, key: str, tp: Any, value: Any, where: str, override: bool = False) -> ConfigError:
        """`value` does not have the type `tp` of `key` (`override`: it came from `--set` text)."""
        shown = f"`{value}`" if override and isinstance(value, str) else f"{value!r} ({toml_kind(value)})"
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        float_ok = float in [base_type(a) for a in arms(tp)[0]]
        extra = " (an integer is accepted for a number; true/false are not numbers)" if float_ok else ""
        return ConfigError(
            f"wrong type for `{key}` in {where}: expected {describe(tp, override)}{extra}, got {shown}. "
            f"Change the value of `{key}`."
        )

    def bad_choice(self, key: str, value: Any, allowed: tuple[Any, ...], where: str) -> ConfigError:
        """`value` of `key` is none of the values of its Literal type."""
        shown = ", ".join(repr(a) if isinstance(a, str) else str(a) for a in allowed)
        hint = ""
        if isinstance(value, str):
            names = [str(a) for a in allowed]
            same_case = [n for n in names if n.lower() == value.lower()]
            close = same_case[0] if same_case else closest(value, names)
            hint = f" (did you mean {close!r}?)" if close else ""
        return ConfigError(f"`{key}` = {value!r} is not supported{hint}; set it to one of {shown}.")


# --------------------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------------------


class Engine:
    """Builds dataclass trees of schema `root` from TOML, strictly; `hooks` and `messages` as described above."""

    def __init__(
        self,
        root: type,
        hooks: Hooks | None = None,
        messages: Messages | None = None,
        unknown_first: bool = False,
    ) -> None:
        self.root = root
        self.hooks = hooks or Hooks()
        self.messages = messages or Messages()
        self.unknown_first = unknown_first
        """Report a table's unknown keys (the first by name) before checking any of its values, the reward
        service's order (for a config whose hooks drop no keys); otherwise keys are checked in file order."""

    def parse_toml(self, text: str, where: str) -> dict[str, Any]:
        """Parse TOML text; a syntax error becomes `messages.malformed_toml`."""
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise self.messages.malformed_toml(where, err, text) from err

    def build(self, data: Any, ctx: Context, cls: type | None = None, path: str = "") -> Any:
        """Instantiate dataclass `cls` (default: the root) from the TOML table `data` found at dotted `path`."""
        cls = self.root if cls is None else cls
        if not isinstance(data, dict):
            raise self.messages.wrong_type(path, cls, data, ctx.where)
        data = self.hooks.rename_keys(data, path, ctx)
        hints = field_types(cls)
        unknown = sorted(key for key in data if key not in hints) if self.unknown_first else []
        if unknown:
            raise self.unknown_key(unknown[0], path, cls, ctx)
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            dotted = f"{path}.{key}" if path else key
            try:
                if key not in hints:
                    if self.hooks.drop(dotted, value, ctx):
                        continue
                    raise self.unknown_key(key, path, cls, ctx)
                kwargs[key] = self.coerce(self.hooks.map_value(dotted, value, ctx), hints[key], dotted, ctx)
            except ConfigError as err:
                _locate(err, dotted, ctx.text)
                raise
            ctx.given.add(dotted)
        return cls(**kwargs)

    def unknown_key(self, key: str, path: str, cls: type, ctx: Context) -> ConfigError:
        names = list(field_types(cls))
        return self.messages.unknown_key(key, path, names, self.root, ctx.where, self.hooks.more_names(path))

    def coerce(self, value: Any, tp: Any, key: str, ctx: Context, override: bool = False) -> Any:
        """Check `value` against the schema type `tp` and convert it (int -> float, tables -> dataclasses)."""
        arm = next((a for a in arms(tp)[0] if _shallow_match(value, a)), None)
        if arm is None:
            raise self.messages.wrong_type(key, tp, value, ctx.where, override)
        item = list_item(arm)
        if item is not None:
            return [self.coerce(v, item, f"{key}[{i}]", ctx, override) for i, v in enumerate(value)]
        if is_section(arm):
            return self.build(value, ctx, arm, key)
        self.check_choice(value, arm, key, ctx.where)
        if arm is float:
            return float(value)
        return value

    def check_choice(self, value: Any, tp: Any, key: str, where: str) -> None:
        """Raise `messages.bad_choice` when a value of Literal type `tp` is none of its values."""
        allowed = choices(tp)
        if allowed is not None and value not in allowed:
            raise self.messages.bad_choice(key, value, allowed, where)

    def check_value(self, value: Any, tp: Any, key: str, where: str) -> None:
        """The choices of an already typed `value` of type `tp` (lists item by item, sections field by field)."""
        if value is None:
            return
        for arm in arms(tp)[0]:
            item = list_item(arm)
            if item is not None and isinstance(value, list):
                for i, v in enumerate(value):
                    self.check_value(v, item, f"{key}[{i}]", where)
                return
            if is_section(arm) and isinstance(value, arm):
                self.check_choices(value, key, where)
                return
        if len(arms(tp)[0]) == 1:
            self.check_choice(value, arms(tp)[0][0], key, where)

    def check_choices(self, obj: Any, path: str = "", where: str = "the config") -> None:
        """Check every Literal field of the dataclass tree `obj` (a config built in code skips the build) and every
        field's declared rules (`field_rules`: its range)."""
        rules = field_rules(type(obj))
        for name, tp in field_types(type(obj)).items():
            dotted = f"{path}.{name}" if path else name
            value = getattr(obj, name)
            self.check_value(value, tp, dotted, where)
            for rule in rules.get(name, ()):
                rule.check(value, dotted)


def _shallow_match(value: Any, tp: Any) -> bool:
    """Does `value` (as parsed by TOML) have the outer kind of `tp`? Nested items are checked by `coerce`."""
    tp = base_type(tp)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if list_item(tp) is not None:
        return isinstance(value, list)
    if typing.get_origin(tp) is dict:
        return isinstance(value, dict)
    if is_section(tp):
        return isinstance(value, dict)
    return False


# --------------------------------------------------------------------------------------------------------------
# TOML line of a key (tomllib gives positions for syntax errors only)
# --------------------------------------------------------------------------------------------------------------

_ARRAY_HEADER = re.compile(r"\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?")
_TABLE_HEADER = re.compile(r"\[\s*([^\[\]]+?)\s*\]\s*(#.*)?")
_KEY_VALUE = re.compile(r"""([A-Za-z0-9_\-."' ]+?)\s*=""")


def _dotted(name: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in name.split("."))


def key_line(text: str, dotted: str) -> int | None:
    """The 1-based line of `text` that sets the dotted key `dotted` (list items as `[i]`), or None when no line
    does (a key inside an inline table is found at the line of its table)."""
    table, counts = "", {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if (match := _ARRAY_HEADER.fullmatch(stripped)) is not None:
            name = _dotted(match.group(1))
            counts[name] = counts.get(name, -1) + 1
            table = f"{name}[{counts[name]}]"
        elif (match := _TABLE_HEADER.fullmatch(stripped)) is not None:
            table = _dotted(match.group(1))
        elif (match := _KEY_VALUE.match(stripped)) is not None and not stripped.startswith("#"):
            key = _dotted(match.group(1))
            full = f"{table}.{key}" if table else key
            if dotted == full or dotted.startswith((f"{full}.", f"{full}[")):
                return number
            continue
        else:
            continue
        if dotted == table:
            return number
    return None


def _locate(err: ConfigError, dotted: str, text: str) -> None:
    """Append the TOML line that sets `dotted` to the message of `err`, once (the innermost key wins)."""
    if getattr(err, "located", False) or not text:
        return
    err.located = True  # type: ignore[attr-defined]
    number = key_line(text, dotted)
    if number is None or not err.args:
        return
    shown = text.splitlines()[number - 1].strip()
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    err.args = (f"{str(err.args[0]).rstrip('.')} (line {number}: `{shown}`).", *err.args[1:])
