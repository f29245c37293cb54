"""Model families behind one adapter interface (base.py); `load_adapter` picks the family from model_index.json."""

from __future__ import annotations

import torch

from sanarl.config.schema import PolicyConfig
from sanarl.errors import WeightsError
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.models.loading import pipeline_class_name, resolve_weights


def _adapters() -> dict[str, type[DiffusionAdapter]]:
    from sanarl.models.sana import SanaAdapter

    return {"SanaPipeline": SanaAdapter}


def load_adapter(policy: PolicyConfig, device: torch.device | str = "cpu") -> DiffusionAdapter:
    """Resolve `policy.model_name_or_path`, pick the family adapter and load the pipeline onto `device`."""
    directory = resolve_weights(policy.model_name_or_path, policy.model_revision)
    class_name = pipeline_class_name(directory)
    adapters = _adapters()
    if class_name not in adapters:
        raise WeightsError(
            f"{directory}: pipeline class {class_name} is not supported; sanarl supports "
            + ", ".join(adapters)
        )
    return adapters[class_name].load(directory, policy, torch.device(device))


__all__ = ["Cond", "DiffusionAdapter", "load_adapter"]
