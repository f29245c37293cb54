"""Dataset-plugin resolution: turn the CLI's positional plugin argument into a module and check its factories.

A plugin is a dotted module (`sanarl.datasets.shapes`, `mypkg.data`) or a path to a `.py` file (`./my_plugin.py`,
absolute or relative to the current directory). Three failures are told apart:

- not found: no such module / file (PluginError naming it, with the built-in plugins and a did-you-mean);
- raised while importing: the module exists but its import failed, including a *nested* missing import inside it
  (PluginError carrying the original traceback text, chained with `raise ... from err`);
- contract broken: `check_plugin` finds a required factory missing or not callable.

The plugin contract is documented in docs/plugins.md.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import logging
import pkgutil
import re
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sanarl.config.cosmos import drop_in
from sanarl.errors import PluginError

log = logging.getLogger(__name__)

_DOCS = "docs/plugins.md"
_FILE_PREFIX = "sanarl_plugin_"
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_DEFINES_GET_DATASET = re.compile(r"^(def get_dataset\b|get_dataset\s*=)", re.MULTILINE)

FACTORY_SIGNATURES: dict[str, str] = {
    "get_dataset": "get_dataset(config) -> Dataset",
    "get_val_dataset": "get_val_dataset(config) -> Dataset | None",
    "collate": "collate(items: list[dict]) -> batch",
}
"""How each known factory is called (shown in contract errors); `config` is the resolved `sanarl.config.Config`."""


def resolve_plugin(spec: str, notice: Callable[[str], None] | None = None) -> types.ModuleType:
    """Import the dataset plugin named by `spec` (a dotted module or a `.py` path) and return the module.

    Cosmos-RL's launcher names (`cosmos_rl.tools.dataset.diffusion_nft`, ...) resolve to sanarl's plugins, with a
    one-line `notice` (default: a logged warning); see `drop_in.PLUGINS`.

    A `.py` file is imported under a private module name (`sanarl_plugin_<stem>_<hash>`, cached in sys.modules,
    so resolving the same file twice returns the same module) and its folder is put first on sys.path, as when
    running a script, so it can import sibling modules. Raises PluginError (see the module docstring).
    """
    text = cosmos_plugin(spec, notice)
    if not text:
        raise PluginError(
            "the dataset plugin argument is empty; pass a dotted module (e.g. `sanarl.datasets.diffusers_dataset`) "
            f"or the path of a .py file (e.g. `./my_plugin.py`); see {_DOCS}."
        )
    if _looks_like_path(text):
        return _import_file(text)
    if not _DOTTED.fullmatch(text):
        raise PluginError(
            f"dataset plugin `{text}` is neither a dotted module name nor a path to a .py file; pass e.g. "
            f"`sanarl.datasets.diffusers_dataset` or `./my_plugin.py`; see {_DOCS}."
        )
    return _import_dotted(text)


def cosmos_plugin(spec: str, notice: Callable[[str], None] | None = None) -> str:
    """`spec`, or sanarl's plugin for a Cosmos-RL launcher name (announced through `notice`)."""
    try:
        found = drop_in.plugin_for(spec)
    except ValueError as err:
        raise PluginError(f"{err} See docs/cosmos-rl.md.") from None
    if found is None:
        return spec.strip()
    (notice or log.warning)(found[1])
    return found[0]


def check_plugin(
    module: types.ModuleType,
    required: Sequence[str] = ("get_dataset",),
    optional: Sequence[str] = ("get_val_dataset", "collate"),
) -> None:
    """Check that `module` defines every `required` factory as a callable; `optional` ones must be callable or None.

    Raises PluginError listing the missing names and the contract.
    """
    label = plugin_label(module)
    missing = [name for name in required if not hasattr(module, name)]
    if missing:
        raise PluginError(
            f"dataset plugin {label} does not define {', '.join(f'`{m}`' for m in missing)}. {_contract(required, optional)}"
        )
    for name in required:
        _check_callable(module, name, label, allow_none=False, required=required, optional=optional)
    for name in optional:
        _check_callable(module, name, label, allow_none=True, required=required, optional=optional)


def plugin_label(module: types.ModuleType | LoadedPlugin) -> str:
    """How messages name a plugin: its dotted name, or its file for plugins loaded from a path."""
    if isinstance(module, LoadedPlugin):
        module = module.module
    if module.__name__.startswith(_FILE_PREFIX) and getattr(module, "__file__", None):
        return f"`{module.__file__}`"
    return f"`{module.__name__}`"


def builtin_plugins() -> list[str]:
    """Dotted names of the plugins shipped in `sanarl.datasets`: modules whose source defines `get_dataset`. The
    package is found by name, not imported (config sits below datasets, docs/architecture.md)."""
    spec = importlib.util.find_spec("sanarl.datasets")
    found = []
    for info in pkgutil.iter_modules(list(spec.submodule_search_locations or []) if spec else []):
        base = Path(info.module_finder.path) / info.name  # type: ignore[union-attr]
        source = base / "__init__.py" if info.ispkg else base.with_suffix(".py")
        try:
            text = source.read_text(encoding="utf-8")
        except OSError:
            continue
        if not info.name.startswith("_") and _DEFINES_GET_DATASET.search(text):
            found.append(f"sanarl.datasets.{info.name}")
    return sorted(found)


def _contract(required: Sequence[str], optional: Sequence[str]) -> str:
    must = "; ".join(f"`{FACTORY_SIGNATURES.get(n, n)}`" for n in required) or "nothing"
    may = "; ".join(f"`{FACTORY_SIGNATURES.get(n, n)}`" for n in optional) or "nothing else"
    return f"A dataset plugin must define {must} and may define {may}; see {_DOCS}."


def _check_callable(
    module: types.ModuleType,
    name: str,
    label: str,
    *,
    allow_none: bool,
    required: Sequence[str],
    optional: Sequence[str],
) -> None:
    value = getattr(module, name, None)
    if callable(value) or (allow_none and value is None):
        return
    raise PluginError(
        f"`{name}` in dataset plugin {label} is {type(value).__name__} {value!r:.60}, not a function; define "
        f"`def {name}(...)` instead. {_contract(required, optional)}"
    )


def _looks_like_path(text: str) -> bool:
    return text.endswith(".py") or "/" in text or "\\" in text or text.startswith((".", "~"))


def _import_file(text: str) -> types.ModuleType:
    """Import the plugin file `text` (relative to the current directory or absolute)."""
    path = Path(text).expanduser()
    resolved = path.resolve()
    if not resolved.exists():
        raise PluginError(
            f"dataset plugin file `{text}` does not exist (resolved to {resolved}, from the current directory "
            f"{Path.cwd()}); check the path, or pass a dotted module such as `sanarl.datasets.diffusers_dataset`; "
            f"see {_DOCS}."
        )
    if resolved.is_dir() or resolved.suffix != ".py":
        kind = "a directory" if resolved.is_dir() else "not a .py file"
        raise PluginError(
            f"dataset plugin `{text}` is {kind} (resolved to {resolved}); pass the path of a .py file, or the "
            f"dotted name of an importable package; see {_DOCS}."
        )
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", resolved.stem)
    name = f"{_FILE_PREFIX}{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if str(resolved.parent) not in sys.path:
        sys.path.insert(0, str(resolved.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(name, None)
        raise _raised_error(f"`{text}` ({resolved})", err) from err
    return module


def _import_dotted(name: str) -> types.ModuleType:
    """Import the dotted module `name`; a missing `name` (or parent) is "not found", anything else "raised"."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is not None and (name == err.name or name.startswith(err.name + ".")):
            raise _not_found_error(name, err.name) from err
        raise _raised_error(f"`{name}`", err) from err
    except Exception as err:
        raise _raised_error(f"`{name}`", err) from err


def _not_found_error(name: str, missing: str) -> PluginError:
    builtins = builtin_plugins()
    close = difflib.get_close_matches(name, builtins, n=1, cutoff=0.75)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    local = Path(name.replace(".", "/") + ".py")
    if local.is_file():
        hint += f" A file `{local}` exists here: pass it as `./{local.as_posix()}`."
    shipped = ", ".join(builtins) or "none"
    return PluginError(
        f"dataset plugin `{name}` was not found: no importable module named `{missing}` (searched sys.path; a "
        f"module in the current directory needs a `./name.py` path or PYTHONPATH=.).{hint} Built-in plugins: "
        f"{shipped}. A plugin may also be the path of a .py file; see {_DOCS}."
    )


def _raised_error(label: str, err: BaseException) -> PluginError:
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    if isinstance(err, ModuleNotFoundError) and err.name:
        fix = (
            f"install the missing dependency `{err.name.split('.')[0]}` or remove that import from the plugin"
        )
    else:
        fix = "fix the error in the plugin"
    return PluginError(
        f"dataset plugin {label} was found but raised {type(err).__name__} while importing: {err}. To continue, "
        f"{fix}. Original traceback:\n{tb}"
    )


class DatasetPlugin(Protocol):
    """What sanarl calls on a dataset plugin (docs/plugins.md): `get_dataset` always; `get_val_dataset` and
    `collate` when the module defines them (`getattr(plugin, name, None)`)."""

    def get_dataset(self, config: Any) -> Any: ...


class LoadedPlugin:
    """A resolved and checked plugin module whose datasets are read once per config object.

    A training start reads the training set for the reward-prompt check, the preflight and the task; through
    this wrapper the plugin's `get_dataset(config)` runs once for them. Other attributes are the module's."""

    def __init__(self, module: types.ModuleType) -> None:
        check_plugin(module)
        self.module = module
        self._read: dict[tuple[str, int], tuple[Any, Any]] = {}

    def get_dataset(self, config: Any) -> Any:
        return self._once("get_dataset", config)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.module, name)  # AttributeError for a factory the module does not define
        if name == "get_val_dataset" and value is not None:
            return lambda config: self._once(name, config)
        return value

    def _once(self, name: str, config: Any) -> Any:
        key = (name, id(config))
        if key not in self._read:
            self._read[key] = (config, getattr(self.module, name)(config))  # config held: its id stays unique
        return self._read[key][1]


def load_plugin(spec: str, notice: Callable[[str], None] | None = None) -> LoadedPlugin:
    """`resolve_plugin` + `check_plugin`, wrapped so each dataset is read once (PluginError as they raise)."""
    return LoadedPlugin(resolve_plugin(spec, notice))
