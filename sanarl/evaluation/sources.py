"""What `sanarl eval` loads: a model id / pipeline directory, or a training run, checkpoint or export directory.

`resolve_source(spec, kind, ...)` turns a `--model` / `--checkpoint` argument into a `ModelSource` (label, config,
weights to apply), without loading anything; `load_source(source)` builds the adapter with those weights:

| argument | recognised by | config | weights |
|---|---|---|---|
| run dir | `config.toml` + `checkpoints/step_*` | the run's config.toml | newest checkpoint, EMA when it holds EMA |
| run dir without checkpoints | `config.toml` + `export/` | the run's config.toml | the export (below) |
| checkpoint dir | `meta.json` | `<run>/config.toml` two levels up, else `--config` | that checkpoint (EMA if held) |
| LoRA export | `pytorch_lora_weights.safetensors` | `<run>/config.toml` one level up, else `--config` | base + LoRA |
| pipeline export / model dir | `model_index.json` | `--config` (model path replaced) | the pipeline |
| model id | anything else (`sanarl-tiny:shapes-base`, a Hub id) | `--config`, else defaults | the pipeline |
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sanarl.config import Config, apply_overrides
from sanarl.errors import DataError
from sanarl.methods.config_loading import load_config
from sanarl.models.base import DiffusionAdapter
from sanarl.models.weight_sources import TINY_PREFIX
from sanarl.training.run_folder.checkpoint_store import list_checkpoints

LORA_FILE = "pytorch_lora_weights.safetensors"
TINY_DEFAULTS: tuple[str, ...] = (
    "policy.diffusers.inference_size=[32,32]",
    "policy.diffusers.max_prompt_length=16",
    "policy.diffusers.complex_human_instruction=false",
)
"""Overrides applied to a `sanarl-tiny:` model when neither a run nor `--config` gives a config."""


@dataclass
class ModelSource:
    """One model to evaluate.

    label: a short name for tables and file names; kind: "model" | "checkpoint" | "lora" | "pipeline";
    config: the config it generates with (policy, sampler); checkpoint: checkpoint dir to apply (kind
    "checkpoint"); lora_dir: directory holding the LoRA file (kind "lora"); use_ema: apply a held EMA shadow.
    """

    label: str
    kind: str
    config: Config
    checkpoint: Path | None = None
    lora_dir: Path | None = None
    use_ema: bool = True


def safe_name(label: str) -> str:
    """`label` as a file name: runs of characters other than letters, digits, `.`, `_`, `-` become `_`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "model"


def base_config(config: Config | None, model: str | None) -> Config:
    """`config` (a copy) or the schema defaults, with `model` as `policy.model_name_or_path` when given; a tiny model
    without a config gets `TINY_DEFAULTS` (32 px, short prompts)."""
    cfg = apply_overrides(config, []) if config is not None else Config()
    if model is not None:
        cfg.policy.model_name_or_path = model
        if config is None and model.startswith(TINY_PREFIX):
            cfg = apply_overrides(cfg, TINY_DEFAULTS)
    return cfg


def _run_config(run_dir: Path, fallback: Config | None, what: str) -> Config:
    """The run's resolved `config.toml`, else `fallback`; neither -> DataError naming `what`."""
    path = run_dir / "config.toml"
    if path.is_file():
        return load_config(path).config
    if fallback is None:
        raise DataError(
            f"`--checkpoint {what}`: no config.toml found in {run_dir}, so the model and sampler it was trained with "
            "are unknown. Pass `--config PRESET` (the preset the run used)."
        )
    return apply_overrides(fallback, [])


def _no_checkpoint(path: Path) -> DataError:
    return DataError(
        f"`--checkpoint {path}` holds no checkpoint: expected a run directory (config.toml with checkpoints/"
        "step_NNNNNNNN/ or export/), a checkpoint directory (with meta.json), or an export directory (with "
        f"{LORA_FILE} or model_index.json). Train first, or point to one of those."
    )


def _from_export(path: Path, config: Config | None, label: str) -> ModelSource:
    """A LoRA export (base from the run's config) or a pipeline export."""
    if (path / LORA_FILE).is_file():
        cfg = _run_config(path.parent, config, str(path))
        return ModelSource(label, "lora", cfg, lora_dir=path)
    cfg = base_config(config, str(path))
    return ModelSource(label, "pipeline", cfg)


def resolve_checkpoint(spec: str, config: Config | None = None) -> ModelSource:
    """A `--checkpoint` argument -> ModelSource (see the module table). Raises DataError when it holds no model."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise DataError(
            f"`--checkpoint {spec}`: {path} is not a directory. Point it to a run, checkpoint or export."
        )
    path = path.resolve()
    if (path / "meta.json").is_file():
        cfg = _run_config(path.parent.parent, config, spec)
        return ModelSource(f"{path.parent.parent.name}/{path.name}", "checkpoint", cfg, checkpoint=path)
    if (path / LORA_FILE).is_file() or (path / "model_index.json").is_file():
        return _from_export(path, config, f"{path.parent.name}/{path.name}")
    for root in (path / "checkpoints", path):
        found = list_checkpoints(root)
        if found:
            run = path if root.name == "checkpoints" else path.parent
            cfg = _run_config(run, config, spec)
            return ModelSource(f"{run.name}/{found[-1].name}", "checkpoint", cfg, checkpoint=found[-1])
    export = path / "export"
    if export.is_dir() and ((export / LORA_FILE).is_file() or (export / "model_index.json").is_file()):
        return _from_export(export, config, f"{path.name}/export")
    raise _no_checkpoint(path)


def resolve_model(spec: str, config: Config | None = None) -> ModelSource:
    """A `--model` argument (model id or pipeline directory) -> ModelSource."""
    return ModelSource(spec, "model", base_config(config, spec))


def unique_labels(sources: list[ModelSource]) -> list[ModelSource]:
    """Make labels distinct (`label`, `label#2`, ...) so file names and table columns never collide."""
    seen: dict[str, int] = {}
    out = []
    for src in sources:
        count = seen.get(src.label, 0) + 1
        seen[src.label] = count
        out.append(src if count == 1 else replace(src, label=f"{src.label}#{count}"))
    return out


def load_source(source: ModelSource, device: torch.device | str = "cpu") -> DiffusionAdapter:
    """Build the adapter of `source` on `device` with its weights applied, transformer in eval mode."""
    from sanarl.api import quiet_libraries
    from sanarl.models import load_adapter

    quiet_libraries()
    adapter = load_adapter(source.config.policy, device)
    if source.kind == "checkpoint" and source.checkpoint is not None:
        from sanarl.evaluation.apply_checkpoint import apply_checkpoint

        apply_checkpoint(adapter, source.config, source.checkpoint, use_ema=source.use_ema)
    elif source.kind == "lora" and source.lora_dir is not None:
        adapter.pipeline.load_lora_weights(str(source.lora_dir))
    adapter.trainable_module().eval()
    return adapter
