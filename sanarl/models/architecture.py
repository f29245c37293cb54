"""A model's transformer architecture without its weights: its config, and the module built on the meta device.

`sanarl validate` plans from shapes alone (quantized layers, weight shares) on a machine without the weights, so the
transformer configs of the shipped presets' models ship as package data (`sanarl/data/models/architectures/`, the
Hub's `transformer/config.json` of each, file name = the Hub id with "/" as "--"). A local pipeline directory, a
tiny model or a Hub snapshot already in the cache is read instead, when present.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sanarl.config.presets import data_dir
from sanarl.models.tiny import ensure_tiny_pipeline
from sanarl.models.weight_sources import TINY_PREFIX, local_weights

ARCHITECTURES_DIR = data_dir("models", "architectures")


def shipped_architecture(name: str) -> Path:
    """The shipped config file for Hub id `name` (it may not exist)."""
    return ARCHITECTURES_DIR / (name.replace("/", "--") + ".json")


def _pipeline_dir(name: str, revision: str | None) -> Path | None:
    if name.startswith(TINY_PREFIX):
        return ensure_tiny_pipeline(name[len(TINY_PREFIX) :])
    return local_weights(name, revision)


def transformer_config(name: str, revision: str | None = None) -> dict[str, Any] | None:
    """The transformer config of `policy.model_name_or_path = name`: from the local pipeline (tiny, directory, Hub
    cache), else the shipped copy; None when neither is here. A pipeline's own transformer class (model_index.json)
    is recorded under `_module` when it is not a diffusers class."""
    directory = _pipeline_dir(name, revision)
    if directory is not None and (directory / "transformer" / "config.json").is_file():
        config = json.loads((directory / "transformer" / "config.json").read_text())
        index = json.loads((directory / "model_index.json").read_text())
        library = index.get("transformer", ["diffusers"])[0]
        if library != "diffusers":
            config["_module"] = library
        return config
    shipped = shipped_architecture(name)
    return json.loads(shipped.read_text()) if shipped.is_file() else None


def meta_transformer(config: dict[str, Any]) -> nn.Module:
    """The transformer of `config` on the meta device: every layer and shape, no memory, no weights."""
    module = importlib.import_module(config.get("_module", "diffusers"))
    cls = getattr(module, config["_class_name"])
    kwargs = {k: v for k, v in config.items() if not k.startswith("_")}
    with torch.device("meta"):
        return cls.from_config(kwargs)
