"""The configuration reference, generated from the schema: every key with its type, default and doc.

`python -m sanarl.config.reference > docs/configuration.md` writes docs/configuration.md; a test regenerates it and
fails when the file is stale, so the reference never drifts from `schema.py`. Docs are the attribute docstrings
written under each field (read with `ast`, since Python keeps no attribute docstrings at run time).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sanarl.config import engine, schema

HEADER = """# Configuration reference

Every key of a sanarl preset, section by section: its type, its default, its rule (a range, or what a list or a
text must hold), the methods that read it (`all`: every method; the others ignore a key they do not read) and what
it does. Generated from the schema
(`sanarl/config/schema.py` and the `*_schema.py` modules beside it that declare a method's keys) by
`python -m sanarl.config.reference > docs/configuration.md`; a test fails when this file is stale. Choice keys
list their values; a rule is checked when the config loads (rules that depend on another key, or on the method,
are checked there too and named in their messages); `--set` takes the same types. Cosmos-RL's own keys that sanarl
accepts and reports as ignored or not applicable are in docs/cosmos-rl.md.
"""


@dataclass(frozen=True)
class KeyDoc:
    """One leaf key of the schema."""

    dotted: str
    type_name: str
    default: str
    doc: str
    range: str = ""
    """The rules declared on the field (`>= 1`, `in (0, 1]`, `not empty`), "" when none."""
    methods: tuple[str, ...] = ()
    """The methods that read the key (the `METHODS` of the class that declares it); () = every method."""


def declaring_class(cls: type, name: str) -> type:
    """The class of `cls`'s MRO whose body declares field `name` (a section composed of method key groups, e.g.
    `TrainPolicyConfig`, inherits most of its fields)."""
    return next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the attribute docstring written under it in the class body ("" when it has none)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        is_doc = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
        text = following.value.value if is_doc else ""  # type: ignore[union-attr]
        docs[node.target.id] = " ".join(str(text).split())
    return docs


def type_name(tp: Any) -> str:
    """A reader's spelling of a field type: `int`, `list[str]`, `"euler" | "dpm2"`, `float | None`."""
    members, optional = engine.arms(tp)
    names = []
    for arm in members:
        values = engine.choices(arm)
        item = engine.list_item(arm)
        if values is not None:
            names.append(" | ".join(repr(v).replace("'", '"') for v in values))
        elif item is not None:
            names.append(f"list[{type_name(item)}]")
        else:
            names.append(getattr(arm, "__name__", str(arm)))
    return " | ".join(names + (["None"] if optional else []))


def default_text(f: dataclasses.Field) -> str:
    """The default of a field as TOML-ish text (`1e-05`, `"euler"`, `[1024, 1024]`, `none`)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if value is None:
        return "none (unset)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value).replace("'", '"')


def keys(cls: type = schema.Config, prefix: str = "") -> Iterator[tuple[str, type, list[KeyDoc]]]:
    """Each section under `cls` (depth first, in declaration order) with its leaf keys."""
    types = engine.field_types(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    rules = engine.field_rules(cls)
    leaves, sections = [], []
    for name, tp in types.items():
        sub = engine.section_class(tp)
        dotted = f"{prefix}{name}"
        if sub is not None:
            sections.append((dotted, sub))
        else:
            limits = ", ".join(r.text() for r in rules.get(name, ()) if hasattr(r, "text"))
            owner = declaring_class(cls, name)
            doc = field_docs(owner).get(name, "")
            methods = tuple(getattr(owner, "METHODS", ()))
            leaves.append(KeyDoc(dotted, type_name(tp), default_text(by_name[name]), doc, limits, methods))
    yield prefix.rstrip("."), cls, leaves
    for dotted, sub in sections:
        yield from keys(sub, f"{dotted}.")


def undocumented() -> list[str]:
    """Dotted keys whose field has no docstring (the reference test keeps this empty)."""
    return [k.dotted for _, _, leaves in keys() for k in leaves if not k.doc]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """docs/configuration.md as text."""
    out = [HEADER]
    for section, cls, leaves in keys():
        if not section or not leaves:
            continue
        summary = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
        out += [
            f"## `[{section}]`",
            "",
            _cell(summary),
            "",
            "| key | type | default | rule | methods | what it does |",
            "|---|---|---|---|---|---|",
        ]
        for k in leaves:
            name = k.dotted.rsplit(".", 1)[-1]
            limits = f"`{_cell(k.range)}`" if k.range else ""
            methods = ", ".join(k.methods) or "all"
            out.append(
                f"| `{name}` | `{_cell(k.type_name)}` | `{_cell(k.default)}` | {limits} | {methods} | {_cell(k.doc)} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
