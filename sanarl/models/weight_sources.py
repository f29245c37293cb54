"""Where a model's weights come from, and which adapter loads them.

`policy.model_name_or_path` is one of:
- `sanarl-tiny:<name>`: a tiny random-init pipeline built from config (tiny.py) into the local cache on first use,
  then loaded through the same `from_pretrained` path real weights take;
- a local diffusers pipeline directory (holding `model_index.json`);
- a Hub id, resolved from the local cache first, downloaded otherwise; when neither works the error says which
  files are missing and how to provide them (never a hub traceback).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sanarl.errors import WeightsError
from sanarl.models.tiny import ensure_tiny_pipeline

TINY_PREFIX = "sanarl-tiny:"


def _missing_weights_message(name: str, reason: str) -> str:
    return (
        f'weights for `policy.model_name_or_path = "{name}"` are not available: {reason}. Provide them in one of '
        f"two ways: (1) on a machine with Hub access run `hf download {name}` and make its cache "
        "(HF_HOME) visible here, or (2) download the pipeline directory (model_index.json plus its component "
        "folders) and set `policy.model_name_or_path` to that local path (e.g. `--set "
        "policy.model_name_or_path=/data/models/...`)."
    )


def local_weights(name: str, revision: str | None = None) -> Path | None:
    """The local pipeline directory for `name` if it is already here (tiny, local dir or Hub cache), else None."""
    if name.startswith(TINY_PREFIX):
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, revision=revision, local_files_only=True))
    except Exception:
        return None


def resolve_weights(name: str, revision: str | None = None) -> Path:
    """A local pipeline directory for `name`, building (tiny) or downloading (Hub) it when needed."""
    if name.startswith(TINY_PREFIX):
        return ensure_tiny_pipeline(name[len(TINY_PREFIX) :])
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise WeightsError(
                f'`policy.model_name_or_path = "{name}"` is a directory without model_index.json; point it at a '
                "diffusers pipeline directory (the folder that holds model_index.json, transformer/, vae/, ...)."
            )
        return path
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise WeightsError(f'`policy.model_name_or_path = "{name}"`: no such directory; fix the path.')
    cached = local_weights(name, revision)
    if cached is not None:
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        raise WeightsError(
            _missing_weights_message(name, "not in the local Hub cache and HF_HUB_OFFLINE is set")
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, revision=revision))
    except Exception as err:
        reason = f"not in the local Hub cache and the download failed ({type(err).__name__})"
        raise WeightsError(_missing_weights_message(name, reason)) from None


def pipeline_class_name(directory: Path) -> str:
    """`_class_name` of a pipeline directory's model_index.json."""
    index = directory / "model_index.json"
    try:
        return json.loads(index.read_text())["_class_name"]
    except (OSError, KeyError, json.JSONDecodeError) as err:
        raise WeightsError(
            f"{index}: cannot read the pipeline class ({err}); is this a diffusers pipeline?"
        ) from None
