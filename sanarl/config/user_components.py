"""Run components of the user's own, named in `train.components` (docs/architecture.md, "Run components").

Each entry is a dotted module name; the module defines `build_component(cfg, run, run_dir)`, which returns a
`sanarl.training.component_hooks.RunComponent` or None (to stay out of that run). The loader imports every module
and checks its factory when the config loads, as it resolves a dataset plugin, so a missing module or factory
stops `sanarl validate` and a run before any model loads (ConfigError, exit code 2, naming the key and the
module). The config package reaches the modules by name only (`importlib`), never by an import statement.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from sanarl.errors import ConfigError

FACTORY = "build_component"
"""The function a component module defines: `build_component(cfg, run, run_dir) -> RunComponent | None`."""

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_DOCS = 'docs/architecture.md, "Run components"'


def dotted_names(names: Sequence[str]) -> bool:
    """Every entry is a dotted module name (`my_pkg.my_component`)."""
    return all(isinstance(name, str) and _DOTTED.fullmatch(name) for name in names)


def component_factory(name: str, key: str) -> Callable[..., Any]:
    """The `build_component` of module `name` (the value of config key `key`), imported now.

    Raises:
        ConfigError: the module is not importable, its import raised, or it defines no callable `build_component`;
            the message names `key`, the module and the fix.
    """
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is not None and (name == err.name or name.startswith(err.name + ".")):
            raise ConfigError(
                f"`{key}` = {name!r}: no module `{name}` can be imported (Python found no `{err.name}`); install the "
                f"package that holds it or add its folder to PYTHONPATH, or remove the entry; see {_DOCS}."
            ) from None
        raise _import_failed(name, key, err) from err
    except Exception as err:
        raise _import_failed(name, key, err) from err
    factory = getattr(module, FACTORY, None)
    if not callable(factory):
        found = "defines no" if factory is None else f"has a {type(factory).__name__} as its"
        raise ConfigError(
            f"`{key}` = {name!r}: module `{name}` ({getattr(module, '__file__', None) or 'no file'}) {found} "
            f"`{FACTORY}`; define `def {FACTORY}(cfg, run, run_dir)` returning a RunComponent "
            f"(sanarl.training.component_hooks) or None; see {_DOCS}."
        )
    return factory


def check_components(names: Sequence[str]) -> None:
    """Import every module of `train.components` and check its factory (ConfigError on the first bad entry)."""
    for index, name in enumerate(names):
        component_factory(name, f"train.components[{index}]")


def _import_failed(name: str, key: str, err: BaseException) -> ConfigError:
    return ConfigError(
        f"`{key}` = {name!r}: importing module `{name}` raised {type(err).__name__}: {err}; fix the module (its "
        f"traceback follows with --debug) or remove the entry; see {_DOCS}."
    )
