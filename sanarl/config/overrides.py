"""`--set dotted.key=value` overrides applied to a built config, parsed against the declared field types with
the engine's messages (`engine.py`).

Values are parsed against the field's type: bool true/false/1/0/yes/no/on/off; numbers as Python literals;
lists as a TOML inline array (`[1, 2]`) or comma-separated (`console,wandb`); "none"/"null" for optional fields;
a TOML inline table (`{r = 8}`) for a whole section. Setting a key inside an absent optional section
(`policy.lora.r=8` without `[policy.lora]`) creates that section with its defaults first. A Literal field's value
is checked after the hooks mapped it, as in a file.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from collections.abc import Iterable
from typing import Any

from sanarl.config.engine import (
    Context,
    Engine,
    arms,
    base_type,
    describe,
    field_types,
    in_schema,
    list_item,
    section_class,
)
from sanarl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def apply(engine: Engine, obj: Any, overrides: Iterable[str], record: Context) -> Any:
    """A copy of the dataclass tree `obj` with each "dotted.key=value" override applied in order (later ones win).

    `record` collects what the hooks drop and note (its `where` is replaced by each override's text).
    """
    out = copy.deepcopy(obj)
    for item in overrides:
        key, raw = split_override(item)
        ctx = dataclasses.replace(record, where=f"--set `{item}`")
        key = engine.hooks.rename_key(key, ctx)
        if not in_schema(engine.root, key) and engine.hooks.drop(key, raw_value(raw), ctx):
            continue
        _set_path(engine, out, key, raw, ctx)
    return out


def raw_value(raw: str) -> Any:
    """An override's text as a TOML value when it parses as one (`1`, `true`, `[1, 2]`, `{a = 1}`), else the text."""
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()


def split_override(item: str) -> tuple[str, str]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", key):
        raise ConfigError(
            f"malformed override `{item}`: expected the form `dotted.key=value`, e.g. "
            "`--set train.optm_lr=1e-4` or `--set policy.lora.r=8` (keys as in the preset's sections)."
        )
    return key, raw


def _set_path(engine: Engine, root: Any, key: str, raw: str, ctx: Context) -> None:
    """Walk `key` through the dataclass tree `root` and set its last component from the override text `raw`."""
    parts = key.split(".")
    obj: Any = root
    path = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(obj, list):
            index = _list_index(obj, part, path, ctx)
            path = f"{path}[{index}]"
            if last:
                obj[index] = _parse(engine, raw, type(obj[0]), path, ctx)
                return
            obj = obj[index]
            continue
        hints = field_types(type(obj))
        if part not in hints:
            raise engine.unknown_key(part, path, type(obj), ctx)
        dotted = f"{path}.{part}" if path else part
        if last:
            value = engine.hooks.map_value(dotted, _parse(engine, raw, hints[part], dotted, ctx), ctx)
            engine.check_value(value, hints[part], dotted, ctx.where)
            setattr(obj, part, value)
            ctx.given.add(dotted)
            return
        obj = _descend(obj, part, hints[part], dotted, ctx)
        path = dotted


def _descend(obj: Any, name: str, tp: Any, dotted: str, ctx: Context) -> Any:
    """The section (or list of sections) in field `name` of `obj`; an absent optional section is created."""
    sub = section_class(tp)
    if sub is None:
        raise ConfigError(
            f"`{dotted}` in {ctx.where} is a value ({describe(tp)}), not a section, so it has no sub-keys; "
            f"set it directly, e.g. `--set {dotted}=...`."
        )
    value = getattr(obj, name)
    if value is None:
        value = sub()
        setattr(obj, name, value)
    return value


def _list_index(items: list[Any], part: str, path: str, ctx: Context) -> int:
    if not part.isdigit() or int(part) >= len(items):
        valid = f"an integer from 0 to {len(items) - 1}" if items else "impossible (the array is empty)"
        raise ConfigError(
            f"`{path}.{part}` in {ctx.where}: `{path}` has {len(items)} entries, so the index must be {valid}; "
            "add entries as [[...]] tables in the preset file to set more."
        )
    return int(part)


def _parse(engine: Engine, raw: str, tp: Any, key: str, ctx: Context) -> Any:
    """Parse the override text `raw` as a value of schema type `tp` (see the module docstring for the forms)."""
    text = raw.strip()
    members, optional = arms(tp)
    if optional and text.lower() in ("none", "null"):
        return None
    has_list = any(list_item(a) is not None for a in members)
    if section_class(tp) is not None or (has_list and text.startswith("[")):
        return engine.coerce(_inline_toml(text, tp, key, ctx), tp, key, ctx, override=True)
    if len(members) > 1:  # bool | str: true/false are booleans, anything else is a string
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        return _parse_scalar(engine, raw, str, tp, key, ctx)
    arm = members[0]
    item = list_item(arm)
    if item is not None:
        pieces = [] if not text else [p.strip() for p in text.split(",")]
        return [_parse_scalar(engine, p, item, tp, f"{key}[{i}]", ctx) for i, p in enumerate(pieces)]
    return _parse_scalar(engine, raw, arm, tp, key, ctx)


def _parse_scalar(engine: Engine, raw: str, arm: Any, tp: Any, key: str, ctx: Context) -> Any:
    """Parse one bool/int/float/str from override text; failures name the key and the expected type."""
    text = raw.strip()
    arm = base_type(arm)
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
    raise engine.messages.wrong_type(key, tp, raw, ctx.where, override=True)


def _inline_toml(text: str, tp: Any, key: str, ctx: Context) -> Any:
    """Parse `text` as one TOML value (inline array, inline table or quoted string)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(
            f"cannot parse the value of `{key}` in {ctx.where} as TOML ({err}); expected {describe(tp, True)}, "
            'e.g. `[1, 2]`, `{r = 8}` or `"text"` (quote the whole --set argument for your shell).'
        ) from err
