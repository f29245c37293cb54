"""The trainer config's build hooks (`engine.Hooks`): Cosmos-RL's keys and spellings accepted by sanarl's schema.

Keys of Cosmos-RL's schema that sanarl does not use (`drop_in.NOT_APPLICABLE`, and `schema.IGNORED_KEYS`) are
accepted, dropped, listed in `Context.ignored` and kept with their values in `Context.dropped`; aliases
(`schema.ALIASES`, `drop_in.RENAMED`) and Cosmos-RL spellings of values (`drop_in.VALUE_MAPS`) are renamed with
a note in `Context.notes`.
"""

from __future__ import annotations

from typing import Any

from sanarl.config.cosmos import drop_in
from sanarl.config.engine import Context, Hooks, in_schema, toml_kind
from sanarl.config.schema import ALIASES, IGNORED_KEYS, Config
from sanarl.config.suggest import closest
from sanarl.errors import ConfigError

ALL_ALIASES: dict[str, str] = {**ALIASES, **{k: v[0] for k, v in drop_in.RENAMED.items()}}
"""Every accepted alias -> its canonical key."""


def is_ignored(path: str) -> bool:
    """True for the keys of `schema.IGNORED_KEYS` (and their sub-keys)."""
    parts = drop_in.strip_indices(path).split(".")
    return any(".".join(parts[:n]) in IGNORED_KEYS for n in range(1, len(parts) + 1))


def alias_note(alias: str, canonical: str, where: str) -> str:
    a_key, c_key = alias.rpartition(".")[2], canonical.rpartition(".")[2]
    why = drop_in.RENAMED.get(alias, ("", ""))[1]
    return (
        f"`{a_key}` is read as `{c_key}` (`{alias}` in {where} is Cosmos-RL's spelling; sanarl's key is "
        f"`{canonical}`)." + (f" {why}." if why else "")
    )


class CosmosHooks(Hooks):
    """Cosmos-RL's aliases, dropped keys and value spellings, applied while `Config` is built or overridden."""

    def rename_keys(self, data: dict[str, Any], path: str, ctx: Context) -> dict[str, Any]:
        """Rename alias keys of the table at `path` to their canonical names; both spellings given -> ConfigError.
        At the root, Cosmos-RL's world-model `[model.rl]` table is read into sanarl's keys (`move_wfm_rl`)."""
        out = dict(data)
        if path == "":
            try:
                out, notes, dropped = drop_in.move_wfm_rl(out)
            except ValueError as err:
                raise ConfigError(f"{err} ({ctx.where})") from None
            ctx.notes.extend(notes)
            ctx.ignored.extend(dropped)
            ctx.dropped.update(dropped)
        for alias, canonical in ALL_ALIASES.items():
            a_parent, _, a_key = alias.rpartition(".")
            c_key = canonical.rpartition(".")[2]
            if a_parent != path or a_key not in out:
                continue
            if c_key in out and canonical in drop_in.SHADOWED:  # Cosmos-RL's own key of that name means else
                ctx.ignored.append(canonical)
                ctx.dropped[canonical] = out.pop(c_key)
            if c_key in out:
                raise ConfigError(
                    f"both `{alias}` and `{canonical}` are set in {ctx.where}; they are the same setting "
                    f"(`{a_key}` is Cosmos-RL's spelling). Keep only `{canonical}`."
                )
            out[c_key] = out.pop(a_key)
            ctx.notes.append(alias_note(alias, canonical, ctx.where))
        return out

    def rename_key(self, key: str, ctx: Context) -> str:
        if key not in ALL_ALIASES:
            return key
        ctx.notes.append(alias_note(key, ALL_ALIASES[key], ctx.where))
        return ALL_ALIASES[key]

    def drop(self, dotted: str, value: Any, ctx: Context) -> bool:
        """A Cosmos-RL key sanarl does not use, or one of `schema.IGNORED_KEYS`: recorded and dropped."""
        if self._drop_cosmos(dotted, value, ctx):
            return True
        if is_ignored(dotted):
            ctx.ignored.append(dotted)
            return True
        return False

    def map_value(self, dotted: str, value: Any, ctx: Context) -> Any:
        """`value` with Cosmos-RL's spelling mapped to sanarl's (`drop_in.VALUE_MAPS`), noted; refused ones raise."""
        try:
            new, note = drop_in.map_value(dotted, value)
        except ValueError as err:
            raise ConfigError(f"{err} ({ctx.where})") from None
        if note:
            ctx.notes.append(f"{note[:-1]} ({ctx.where}).")
        return new

    def more_names(self, path: str) -> list[str]:
        return drop_in.known_children(path)

    def _drop_cosmos(self, dotted: str, value: Any, ctx: Context) -> bool:
        """Drop (and record) a Cosmos-RL key sanarl does not use; False when `dotted` is not one of Cosmos-RL's keys.

        A not-applicable Cosmos-RL table is walked so that its keys are checked against Cosmos-RL's schema too.
        """
        if drop_in.is_table(dotted):
            array = drop_in.strip_indices(dotted) in drop_in.ARRAY_TABLES and isinstance(value, list)
            for i, item in enumerate(value if array else [value]):
                where = f"{dotted}[{i}]" if array else dotted
                if not isinstance(item, dict):
                    raise ConfigError(
                        f"wrong type for `{where}` in {ctx.where}: expected a table (Cosmos-RL's "
                        f"[{drop_in.strip_indices(where)}] section), got {item!r} ({toml_kind(item)}). "
                        "Make it a table."
                    )
                known = drop_in.known_children(dotted)
                for key, sub in item.items():
                    if key not in known or not self._drop_cosmos(f"{where}.{key}", sub, ctx):
                        raise _unknown_cosmos_key(key, where, known, ctx.where)
            return True
        if drop_in.treatment(dotted) is None:
            parent, _, key = dotted.rpartition(".")
            if parent and drop_in.is_table(parent) and not in_schema(Config, parent):
                raise _unknown_cosmos_key(key, parent, drop_in.known_children(parent), ctx.where)
            return False
        try:
            drop_in.check_choice(dotted, value)
        except ValueError as err:
            raise ConfigError(
                f"{err} ({ctx.where}); fix the value or remove the key (sanarl does not use it)."
            ) from None
        ctx.ignored.append(dotted)
        ctx.dropped[dotted] = value
        return True


def _unknown_cosmos_key(key: str, path: str, known: list[str], where: str) -> ConfigError:
    close = closest(key, known)
    hint = f"; did you mean `{path}.{close}`?" if close else ""
    return ConfigError(
        f"unknown key `{path}.{key}` in {where}{hint} (valid keys of [{drop_in.strip_indices(path)}], a Cosmos-RL "
        f"table that sanarl accepts and does not use: {', '.join(known)}). Fix its spelling or remove it."
    )
