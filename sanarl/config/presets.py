"""Shipped presets and package data, found through `importlib.resources` from any working directory.

- `sanarl/presets/<name>.toml`: the shipped presets; `--config <name>` (no path) names one, and so does one of
  Sol-RL's config names (`sd3_sol_rl_pickscore`: sanarl.config.sol_rl_names, resolved by the loader).
- `sanarl/data/`: what they point at: `models/` (the shipped tiny bases), `datasets/` (prompt sets, example data),
  `accelerate/` (accelerate launch configs).

Relative input paths in a preset (`*.dataset.local_dir`, a local `policy.model_name_or_path` starting with `.`)
are anchored when it is loaded: a shipped preset's against `sanarl/data/`, any other preset's against the folder
of its own file, `--set` values against the current directory; a run's config.toml so holds absolute input paths
and reruns from anywhere. A relative path starting with `sanarl/data/` that does not exist there names the
installed package's data (the examples of the docs work from any directory, e.g. a Cosmos-RL checkout). `train.output_dir` and `train.resume` stay relative to the current directory (outputs).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from importlib.resources import files
from pathlib import Path

from sanarl.config.suggest import closest
from sanarl.errors import ConfigError

PRESET_SUFFIX = ".toml"


def _package_dir(*parts: str) -> Path:
    """A folder inside the installed `sanarl` package (a real directory: sanarl is never imported from a zip)."""
    return Path(str(files("sanarl").joinpath(*parts)))


def presets_dir() -> Path:
    """The folder of the shipped presets."""
    return _package_dir("presets")


def data_dir(*parts: str) -> Path:
    """`sanarl/data/<parts>`: shipped bases (`models`), prompt sets and examples (`datasets`), `accelerate`."""
    return _package_dir("data", *parts)


def shipped_presets() -> list[Path]:
    """Every shipped preset file, sorted by name."""
    return sorted(presets_dir().glob(f"*{PRESET_SUFFIX}"))


def preset_names() -> list[str]:
    return [path.stem for path in shipped_presets()]


def is_shipped(path: Path) -> bool:
    """Whether `path` is one of the shipped preset files."""
    return path.expanduser().resolve().parent == presets_dir().resolve()


def resolve_preset_path(config: str | Path) -> Path:
    """`--config` value -> a preset file: an existing file path, else the shipped preset of that name.

    `presets/<name>.toml` (the repository-relative form the docs and Cosmos-RL habits use) also names the
    shipped preset when no such local file exists. A value that is neither is returned unchanged so that the
    loader reports it (naming the file); any other missing `<dir>/<name>.toml` whose name is shipped gets a
    ConfigError saying to pass the name instead.
    """
    path = Path(config)
    if path.is_file():
        return path
    name = path.name.removesuffix(PRESET_SUFFIX)
    shipped = presets_dir() / f"{name}{PRESET_SUFFIX}"
    bare = str(config).removesuffix(PRESET_SUFFIX) == name
    in_presets = path.parent == Path("presets")  # `./presets/` normalises to the same
    if (bare or in_presets) and shipped.is_file():
        return shipped
    if shipped.is_file():
        raise ConfigError(
            f"config file `{config}` does not exist; `{name}` is a shipped preset: pass `--config {name}` "
            f"(it resolves from the installed package), or `sanarl presets --copy {name} DIR` to edit a copy."
        )
    return path


def preset_summary(path: Path) -> str:
    """First comment line of a preset (its purpose)."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def copy_preset(name: str, directory: Path) -> Path:
    """Copy the shipped preset `name` into `directory` (created if needed) with its relative data paths made
    absolute, so the copy runs from wherever it is saved. Refuses to overwrite an existing file.
    """
    source = presets_dir() / f"{name.removesuffix(PRESET_SUFFIX)}{PRESET_SUFFIX}"
    if not source.is_file():
        close = closest(name.removesuffix(PRESET_SUFFIX), preset_names(), cutoff=0.7)
        hint = f" Did you mean `{close}` (`sanarl presets --copy {close} {directory}`)?" if close else ""
        raise ConfigError(
            f"`{name}` is not a shipped preset.{hint} `sanarl presets` lists them: {', '.join(preset_names())}."
        )
    target = Path(directory).expanduser() / source.name
    if target.exists():
        raise ConfigError(f"{target} already exists; remove it or copy into another folder.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    except OSError as err:
        raise ConfigError(f"cannot copy {source.name} to {target.parent} ({err.strerror}).") from err
    _absolutize_copy(target)
    return target


_LOCAL_DIR_LINE = re.compile(r'^(\s*local_dir\s*=\s*)"([^"]+)"')


def _absolutize_copy(target: Path) -> None:
    """Rewrite the relative `local_dir = "..."` lines of a copied shipped preset to the package's absolute paths
    (the line's comment about the package goes with it)."""
    lines = []
    for line in target.read_text().splitlines(keepends=True):
        match = _LOCAL_DIR_LINE.match(line)
        if match and not Path(match.group(2)).is_absolute():
            line = f'{match.group(1)}"{(data_dir() / match.group(2)).as_posix()}"\n'
        lines.append(line)
    target.write_text("".join(lines))


# --- anchoring relative input paths ------------------------------------------------------------------------------
def anchor_dir(source: Path) -> Path:
    """The folder a preset's relative input paths are read against: `sanarl/data/` for a shipped preset, the
    folder of the file otherwise."""
    return data_dir() if is_shipped(source) else source.expanduser().resolve().parent


PACKAGE_DATA = "sanarl/data/"
"""A relative input path starting with this names sanarl's shipped data (`sanarl/data/datasets/examples/sft`)."""


def _anchored(value: str, base: Path) -> str:
    if not value.strip() or Path(value).expanduser().is_absolute():
        return value
    local = base / value
    if value.startswith(PACKAGE_DATA) and not local.exists():  # outside a sanarl checkout: the installed copy
        shipped = data_dir(value.removeprefix(PACKAGE_DATA))
        if shipped.exists():
            return str(shipped)
    return str(local)


def anchor_paths(cfg, base: Path):
    """`cfg` with its relative input paths (see the module docstring) made absolute against `base`."""
    tp = cfg.train.train_policy
    train_ds = dataclasses.replace(tp.dataset, local_dir=_anchored(tp.dataset.local_dir, base))
    val_ds = dataclasses.replace(
        cfg.validation.dataset, local_dir=_anchored(cfg.validation.dataset.local_dir, base)
    )
    policy = cfg.policy
    model = policy.model_name_or_path
    if model.startswith(("./", "../")):
        policy = dataclasses.replace(policy, model_name_or_path=_anchored(model, base))
    return dataclasses.replace(
        cfg,
        policy=policy,
        train=dataclasses.replace(cfg.train, train_policy=dataclasses.replace(tp, dataset=train_ds)),
        validation=dataclasses.replace(cfg.validation, dataset=val_ds),
    )
