"""Model families behind one adapter interface (base.py); `load_adapter` picks the family from model_index.json."""

from __future__ import annotations

import importlib

import torch

from sanarl.config.schema import PolicyConfig
from sanarl.errors import WeightsError
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.models.weight_sources import pipeline_class_name, resolve_weights

ADAPTERS: dict[str, str] = {
    "SanaPipeline": "sanarl.models.sana:SanaAdapter",
    "StableDiffusion3Pipeline": "sanarl.models.sd3:SD3Adapter",
    "SanaVideoPipeline": "sanarl.models.sana_video:SanaVideoAdapter",
    "FluxPipeline": "sanarl.models.flux:FluxAdapter",
}
"""diffusers pipeline class (model_index.json `_class_name`) -> "module:AdapterClass", imported on use."""


def _adapter_class(class_name: str) -> type[DiffusionAdapter]:
    module, _, attr = ADAPTERS[class_name].partition(":")
    return getattr(importlib.import_module(module), attr)


def load_adapter(policy: PolicyConfig, device: torch.device | str = "cpu") -> DiffusionAdapter:
    """Resolve `policy.model_name_or_path`, pick the family adapter and load the pipeline onto `device`."""
    directory = resolve_weights(policy.model_name_or_path, policy.model_revision)
    class_name = pipeline_class_name(directory)
    if class_name not in ADAPTERS:
        raise WeightsError(
            f"{directory}: pipeline class {class_name} is not supported; sanarl supports "
            + ", ".join(ADAPTERS)
        )
    return _adapter_class(class_name).load(directory, policy, torch.device(device))


__all__ = ["Cond", "DiffusionAdapter", "load_adapter"]
