"""Local-first resolution of reward weights: a reward option names a local directory or a Hub id.

A local directory is used as it is once it holds the files its kind needs (`model`: config.json and the weights;
`processor`: the image-processor config and a tokenizer; `image_processor`: the image-processor config only). A Hub id
resolves from the Hub cache first (`local_files_only`), then by downloading only the files of its kind unless
`HF_HUB_OFFLINE` is set. What cannot be resolved is collected as `Missing` entries, so one `WeightsError` names every
missing id and file and both ways to provide them; nothing hangs and no hub traceback escapes.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sanarl.errors import WeightsError

MODEL_WEIGHTS_HINT = "model.safetensors or pytorch_model.bin"
MODEL_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""A CLIP model directory holds config.json and one of these."""
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""A processor directory holds one of these (transformers 4 writes the first, 5 the second)..."""
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
"""... and, when text is scored, a tokenizer: tokenizer.json, or vocab.json with merges.txt."""

_MODEL_PATTERNS = ["config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json"]
_MODEL_BIN_PATTERNS = [
    "config.json",
    "pytorch_model.bin",
    "pytorch_model-*.bin",
    "pytorch_model.bin.index.json",
]
_PROCESSOR_PATTERNS = [
    *IMAGE_PROCESSOR_FILES,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
]


def reward_ckpts_dir() -> Path:
    """Directory of reward head checkpoints: `$SANARL_REWARD_CKPTS`, default `./reward_ckpts`."""
    return Path(os.environ.get("SANARL_REWARD_CKPTS", "reward_ckpts")).expanduser()


def reward_ckpt_path(option: str | None, default: str | Path) -> Path:
    """The checkpoint file or folder a reward's path option names (`~` expanded); when the option is unset (None or
    empty), `default` inside `reward_ckpts_dir()`, read when asked (so `$SANARL_REWARD_CKPTS` may change in between)."""
    return Path(option).expanduser() if option else reward_ckpts_dir() / default


def _missing_files(directory: Path, kind: str) -> list[str]:
    """Names of the files `directory` lacks for `kind` ('model', 'processor' or 'image_processor')."""
    present = {p.name for p in directory.iterdir()} if directory.is_dir() else set()
    missing: list[str] = []
    if kind == "model":
        if "config.json" not in present:
            missing.append("config.json")
        if not present & set(MODEL_WEIGHT_FILES) and not any(n.startswith("model-") for n in present):
            missing.append(MODEL_WEIGHTS_HINT)
        return missing
    if not present & set(IMAGE_PROCESSOR_FILES):
        missing.append(" or ".join(IMAGE_PROCESSOR_FILES))
    if kind == "processor" and not any(set(group) <= present for group in TOKENIZER_FILES):
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    return missing


def read_state_dict(
    path: Path, what: str, replacement: str, expected: str = "a state dict"
) -> Mapping[str, Any]:
    """The tensors of a `.safetensors` file or a torch file (`torch.load`, weights only), unwrapped from a
    `{"state_dict": ...}` entry. WeightsError naming `what` the file is and the `replacement` to put there when it
    cannot be read, and `expected` when it holds no mapping."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WeightsError(
            f"{path}: cannot read {what} ({type(exc).__name__}: {exc}); replace it with {replacement}."
        ) from None
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise WeightsError(f"{path}: expected {expected}, got {type(state).__name__}.")
    return state


def hub_snapshot(repo: str, patterns: list[str] | None, offline: bool) -> Path | None:
    """The Hub snapshot folder of `repo` (cache only when `offline`), or None when unavailable."""
    try:
        from huggingface_hub import snapshot_download

        local = offline or _LOCAL_ONLY.get()
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=local))
    except Exception:
        return None


def is_hub_id(name: str) -> bool:
    """`owner/name` (exactly one slash, not a relative or absolute path)."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


_LOCAL_ONLY = contextvars.ContextVar("sanarl_weights_local_only", default=False)


@contextlib.contextmanager
def local_only():
    """Inside the block weights resolve from local directories and the Hub cache only (as with HF_HUB_OFFLINE):
    the checks before a run (`sanarl validate`) look for the weights without downloading them."""
    token = _LOCAL_ONLY.set(True)
    try:
        yield
    finally:
        _LOCAL_ONLY.reset(token)


def env_hub_offline() -> bool:
    """True when `HF_HUB_OFFLINE` is set to anything but 0 / false / no / off."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no", "off")


def hub_offline() -> bool:
    """True when nothing may be downloaded: `HF_HUB_OFFLINE` is set, or inside `local_only()`."""
    return _LOCAL_ONLY.get() or env_hub_offline()


def no_download_reason() -> str:
    """Why nothing was downloaded (when `hub_offline()`): the environment's HF_HUB_OFFLINE, or a check that looks
    on this machine only (`local_only()`: `sanarl validate`, the start's preflight)."""
    return "HF_HUB_OFFLINE is set" if env_hub_offline() else "this check does not download"


@dataclass(frozen=True)
class Missing:
    """Why one weights entry could not be resolved (collected so that one error names all of them).

    `option` is the reward option that points at it, `name` its id or path, `fix` an extra hint (optional).
    """

    option: str
    name: str
    reason: str
    fix: str = ""


def _resolve(name: str, kind: str, option: str) -> Path | Missing:
    """A local directory with the `kind` files of `name` (a path or a Hub id), or why there is none."""
    path = Path(name).expanduser()
    if path.is_dir():
        missing = _missing_files(path, kind)
        return Missing(option, name, f"directory lacks {', '.join(missing)}") if missing else path
    if not is_hub_id(name):
        return Missing(option, name, "no such directory (and not a Hub id of the form owner/name)")
    cached = hub_snapshot(name, None, offline=True)
    if cached is not None and not _missing_files(cached, kind):
        return cached
    needs = ", ".join(_missing_files(cached or Path("/nonexistent"), kind))
    if hub_offline():
        return Missing(option, name, f"not in the local Hub cache (needs {needs}) and {no_download_reason()}")
    if kind == "model":
        for patterns in (_MODEL_PATTERNS, _MODEL_BIN_PATTERNS):
            got = hub_snapshot(name, patterns, offline=False)
            if got is not None and not _missing_files(got, kind):
                return got
    else:
        got = hub_snapshot(name, _PROCESSOR_PATTERNS, offline=False)
        if got is not None and not _missing_files(got, kind):
            return got
    return Missing(option, name, f"not in the local Hub cache (needs {needs}) and the download failed")


def missing_weights_error(reward: str, missing: Sequence[Missing]) -> WeightsError:
    """One WeightsError naming every missing id / directory, its files, and both ways to provide them."""
    listed = "; ".join(f"{m.option} {m.name!r}: {m.reason}" for m in missing)
    fixes = "".join(f" {m.fix}" for m in missing if m.fix)
    repos = [m for m in missing if not m.fix]
    if not repos:
        return WeightsError(f"reward {reward!r} cannot load its weights: {listed}.{fixes}")
    hub_ids = dict.fromkeys(m.name for m in repos if is_hub_id(m.name))
    download = " and ".join(f"`hf download {h}`" for h in hub_ids) or "`hf download <owner/name>`"
    options = " / ".join(dict.fromkeys(f"{m.option}=..." for m in repos))
    return WeightsError(
        f"reward {reward!r} cannot load its weights: {listed}. Provide the models in one of two ways: (1) on a "
        f"machine with Hub access run {download} and make that Hub cache (HF_HOME) visible here, or (2) download "
        f"each repository into a local directory and pass its path as the reward option {options}.{fixes}"
    )


def resolve_dirs(
    reward: str, wanted: Mapping[str, tuple[str, str]], also_missing: Sequence[Missing] = ()
) -> dict[str, Path]:
    """Resolve every `option -> (name, kind)` to a local directory, or raise one WeightsError naming every miss
    (including `also_missing`, e.g. a reward head file the caller looked for itself)."""
    found: dict[str, Path] = {}
    missing: list[Missing] = list(also_missing)
    for option, (name, kind) in wanted.items():
        got = _resolve(name, kind, option)
        if isinstance(got, Missing):
            missing.append(got)
        else:
            found[option] = got
    if missing:
        raise missing_weights_error(reward, missing)
    return found
