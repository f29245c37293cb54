"""Apply a training checkpoint (`<run>/checkpoints/step_N/`, sanarl/training/run_folder/checkpoint_store.py layout) to a freshly loaded adapter.

The checkpoint's `model.safetensors` holds what `Task.state_tensors` saved (every LoRA adapter, or the whole
transformer) and `ema.safetensors`, when the run had EMA, the shadow of every trainable parameter by name. The
exported model of a run holds the EMA weights (runner.Runner.export swaps them in), so evaluation does the same:
model weights first, then the EMA shadow over the trainable ones.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from sanarl.config.schema import Config
from sanarl.core.lora import activate_adapter, add_lora_adapters
from sanarl.errors import DataError
from sanarl.methods.registry import task_class
from sanarl.models.base import DiffusionAdapter


def lora_names(cfg: Config) -> list[str]:
    """Adapter names the run's task created: `[policy.lora].lora_names` plus the task class's own (NFT: "old")."""
    assert cfg.policy.lora is not None
    return list(dict.fromkeys([*cfg.policy.lora.lora_names, *task_class(cfg).lora_names]))


def _add_lora(module: torch.nn.Module, cfg: Config, default_targets: tuple[str, ...]) -> None:
    lora = cfg.policy.lora
    assert lora is not None
    add_lora_adapters(
        module,
        lora_names(cfg),
        r=lora.r,
        alpha=lora.lora_alpha,
        init=lora.init_lora_weights,
        target_modules=lora.target_modules or list(default_targets),
        dropout=lora.lora_dropout,
    )


def _load(module: torch.nn.Module, tensors: dict[str, torch.Tensor], path: Path, group: str) -> None:
    """Load named tensors; any name the module lacks is a DataError (wrong config for this checkpoint)."""
    _, unexpected = module.load_state_dict(tensors, strict=False)
    if unexpected:
        raise DataError(
            f"checkpoint {path} ({group}.safetensors) does not fit the model of its config: unexpected tensors "
            f"{unexpected[:4]}. Evaluate it with the config.toml of the run that wrote it (`--config`)."
        )


@torch.no_grad()
def apply_checkpoint(adapter: DiffusionAdapter, cfg: Config, path: Path, *, use_ema: bool = True) -> dict:
    """Load checkpoint `path` into `adapter` (adding the run's LoRA adapters first when `cfg` has LoRA).

    Returns `{"step": int, "ema": bool}` (whether an EMA shadow was applied).
    """
    import json

    model_file = path / "model.safetensors"
    if not model_file.is_file():
        raise DataError(
            f"checkpoint {path} has no model.safetensors; it is incomplete or not a sanarl checkpoint."
        )
    module = adapter.trainable_module()
    if cfg.policy.lora is not None:
        _add_lora(module, cfg, adapter.default_lora_targets)
    model = load_file(str(model_file))
    if cfg.policy.lora is None:
        missing = sorted(set(module.state_dict()) - set(model))
        if missing:
            raise DataError(
                f"checkpoint {path} lacks transformer weights {missing[:4]}; it was written by a LoRA run: evaluate "
                "it with that run's config.toml (`--config`)."
            )
    _load(module, model, path, "model")
    ema_file = path / "ema.safetensors"
    applied = bool(use_ema and ema_file.is_file())
    if applied:
        _load(module, load_file(str(ema_file)), path, "ema")
    if cfg.policy.lora is not None:
        activate_adapter(module, "default")
    meta = json.loads((path / "meta.json").read_text())
    return {"step": int(meta.get("step", 0)), "ema": applied}
