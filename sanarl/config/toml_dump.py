"""Write a dataclass config tree back as TOML text that the engine reads back to an equal tree.

Every section is written (defaults included), None values and absent optional tables are omitted, lists of
sections become arrays of tables. Secrets (SECRET_KEYS: a reward's `endpoint_api_key`) are written masked.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields, is_dataclass
from typing import Any

SECRET_KEYS = frozenset({"endpoint_api_key"})
"""Keys whose values are secrets (a reward's bearer key): `mask_secrets` writes MASK in their place."""
MASK = "<masked>"


def mask_secrets(value: Any) -> Any:
    """`value` (nested dicts / lists) with every non-empty string under a SECRET_KEYS key replaced by MASK: what a
    run writes to config.toml, meta.json and the tracker (docs/reliability.md, "Secrets")."""
    if isinstance(value, dict):
        return {
            k: MASK if k in SECRET_KEYS and isinstance(v, str) and v else mask_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_secrets(v) for v in value]
    return value


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def dump(obj: Any) -> str:
    """The dataclass tree `obj` as TOML: its plain keys first, then one `[section]` per sub-dataclass."""
    lines: list[str] = []
    _emit_table(obj, "", lines, array=False)
    return "\n".join(lines) + "\n"


def toml_string(text: str) -> str:
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


def toml_key(key: str) -> str:
    """A bare TOML key when possible, else a quoted one."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_string(key)


def toml_value(value: Any) -> str:
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
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{toml_key(str(k))} = {toml_value(v)}" for k, v in mask_secrets(value).items())
        return "{ " + ", ".join(items) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")


def _emit_table(obj: Any, path: str, lines: list[str], array: bool) -> None:
    """Append `[path]` (or `[[path]]`; no header at the root) with the scalar fields of dataclass `obj`, then its
    sub-sections."""
    if path:
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
            lines.append(f"{f.name} = {toml_value(value)}")
    prefix = f"{path}." if path else ""
    for name, value in tables:
        _emit_table(value, f"{prefix}{name}", lines, array=False)
    for name, items in arrays:
        for item in items:
            _emit_table(item, f"{prefix}{name}", lines, array=True)
