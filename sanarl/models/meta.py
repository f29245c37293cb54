"""Real architectures without weights: a preset's transformer built on the meta device from its config, and the
parameter counts of its frozen parts (text encoders, VAE), for the memory and FLOP plan of `sanarl validate`.

Where the shapes come from, for `policy.model_name_or_path`:
- a shipped hub id: the transformer's config from `sanarl.models.architecture` (sanarl/data/models/architectures/),
  the pipeline's VAE and text encoders from sanarl/data/models/pipelines/*.json (the public facts each `source`
  names), their parameter counts from components.json there;
- a local diffusers pipeline directory (the shipped tiny bases too): every component's config.json, built on meta;
- `sanarl-tiny:<name>` of a random-init tiny model: its builder run on the meta device.
Nothing here reads or downloads weights.
"""

from __future__ import annotations

import functools
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from sanarl.config.presets import data_dir
from sanarl.errors import ConfigError
from sanarl.models.architecture import transformer_config

PIPELINES = data_dir("models", "pipelines")


class UnknownArchitecture(ConfigError):
    """No shipped config, local pipeline directory or tiny builder describes the model."""


@dataclass
class Architecture:
    """What the memory plan needs of a pipeline, without weights."""

    name: str
    pipeline_class: str
    """The diffusers pipeline (model_index.json `_class_name`), which picks the family adapter."""
    source: str
    """Where the shapes come from (shipped config and its public source, local configs, tiny builder)."""
    transformer_class: str
    transformer_config: dict
    spatial_factor: int
    temporal_factor: int = 1
    frozen: dict[str, int] = field(default_factory=dict)
    """Frozen component (text encoder(s), VAE) -> parameter count."""


@functools.cache
def components_table() -> dict:
    """components.json: parameter counts (and sources) of text encoders, VAEs and reward models."""
    return json.loads((PIPELINES / "components.json").read_text())


@functools.cache
def shipped_architectures() -> dict[str, Path]:
    """Hub id -> shipped architecture file."""
    table = {}
    for path in sorted(PIPELINES.glob("*.json")):
        if path.name != "components.json":
            for name in json.loads(path.read_text())["names"]:
                table[name] = path
    return table


def architecture(name: str) -> Architecture:
    """The architecture of `policy.model_name_or_path = name` (see the module docstring); ConfigError when none of
    the three sources knows it."""
    from sanarl.models.tiny import SHIPPED, SHIPPED_DIR
    from sanarl.models.weight_sources import TINY_PREFIX

    if name in shipped_architectures():
        return _shipped(name, shipped_architectures()[name])
    if name.startswith(TINY_PREFIX):
        tiny = name[len(TINY_PREFIX) :]
        if tiny in SHIPPED:
            return _from_directory(name, SHIPPED_DIR / SHIPPED[tiny])
        return _from_tiny_builder(name, tiny)
    path = Path(name).expanduser()
    if (path / "model_index.json").is_file():
        return _from_directory(name, path)
    known = ", ".join(shipped_architectures())
    raise UnknownArchitecture(
        f'`policy.model_name_or_path = "{name}"`: its architecture is unknown here (no local pipeline directory, '
        f"not one of the shipped configs: {known}); point it at a local diffusers pipeline directory (only the "
        "config.json files are read) to plan its memory."
    )


def _shipped(name: str, path: Path) -> Architecture:
    spec = json.loads(path.read_text())
    table = components_table()
    frozen = {te: table["text_encoders"][te]["params"] for te in spec["text_encoders"]}
    frozen[spec["vae"]["name"]] = table["vaes"][spec["vae"]["name"]]["params"]
    config = transformer_config(name)
    if config is None:
        raise UnknownArchitecture(f"{path.name} names {name!r}, whose transformer config is not shipped.")
    return Architecture(
        name=name,
        pipeline_class=spec["pipeline"],
        source=f"shipped config {path.name}: {spec['source']}",
        transformer_class=config.pop("_class_name"),
        transformer_config=config,
        spatial_factor=spec["vae"]["spatial_factor"],
        temporal_factor=spec["vae"]["temporal_factor"],
        frozen=frozen,
    )


def _class(library: str, name: str) -> type:
    return getattr(importlib.import_module(library), name)


def _meta_component(library: str, cls_name: str, folder: Path) -> nn.Module:
    """One pipeline component built on meta from its folder's config.json."""
    cls = _class(library, cls_name)
    with torch.device("meta"):
        if library == "transformers":
            from transformers import AutoConfig

            return cls._from_config(AutoConfig.from_pretrained(str(folder)))
        return cls.from_config(cls.load_config(str(folder)))


def _from_directory(name: str, directory: Path) -> Architecture:
    return _from_modules(name, *_directory_modules(directory))


def _directory_modules(directory: Path) -> tuple[str, str, dict[str, nn.Module]]:
    index = json.loads((directory / "model_index.json").read_text())
    modules = {}
    for key, value in index.items():
        if key.startswith("_") or not isinstance(value, list) or value[0] is None:
            continue
        if key in ("transformer", "vae") or key.startswith("text_encoder"):
            modules[key] = _meta_component(value[0], value[1], directory / key)
    return index["_class_name"], f"config.json files of {directory}", modules


def _from_tiny_builder(name: str, tiny: str) -> Architecture:
    return _from_modules(name, *_builder_modules(name, tiny))


def _builder_modules(name: str, tiny: str) -> tuple[str, str, dict[str, nn.Module]]:
    from sanarl.models.tiny import TINY_BUILDERS, _builder

    if tiny not in TINY_BUILDERS:
        raise UnknownArchitecture(f"`policy.model_name_or_path = {name!r}`: unknown tiny model.")
    try:
        with torch.device("meta"):
            pipe, where = _builder(tiny)(), "run on the meta device"
    except RuntimeError:  # a builder that reads values back (.item()): tiny enough to build for real
        pipe, where = _builder(tiny)(), "run on the CPU (a few thousand weights)"
    modules = {k: v for k, v in pipe.components.items() if isinstance(v, nn.Module)}
    return type(pipe).__name__, f"the {tiny} tiny builder, {where}", modules


def _from_modules(name: str, pipeline: str, source: str, modules: dict[str, nn.Module]) -> Architecture:
    transformer = modules.pop("transformer")
    spatial, temporal = vae_factors(modules.get("vae"))
    return Architecture(
        name=name,
        pipeline_class=pipeline,
        source=source,
        transformer_class=type(transformer).__name__,
        transformer_config=dict(transformer.config),
        spatial_factor=spatial,
        temporal_factor=temporal,
        frozen={key: parameter_count(m) for key, m in modules.items()},
    )


def meta_text_encoders(name: str) -> dict[str, nn.Module]:
    """The text encoder modules on meta, where their configs are here (local and tiny pipelines); {} for the
    shipped hub configs, which carry parameter counts only."""
    from sanarl.models.tiny import SHIPPED, SHIPPED_DIR
    from sanarl.models.weight_sources import TINY_PREFIX

    if name in shipped_architectures():
        return {}
    if name.startswith(TINY_PREFIX):
        tiny = name[len(TINY_PREFIX) :]
        found = (
            _directory_modules(SHIPPED_DIR / SHIPPED[tiny])
            if tiny in SHIPPED
            else _builder_modules(name, tiny)
        )
    else:
        found = _directory_modules(Path(name).expanduser())
    return {k: m for k, m in found[2].items() if k.startswith("text_encoder")}


def vae_factors(vae: nn.Module | None) -> tuple[int, int]:
    """(spatial, temporal) downsampling of a VAE from its config (DC-AE, KL, Wan, sanarl's pixel autoencoders)."""
    if vae is None:
        return 1, 1
    cfg = vae.config
    if "scale_factor_spatial" in cfg:
        return int(cfg["scale_factor_spatial"]), int(cfg.get("scale_factor_temporal", 1))
    if "factor" in cfg:
        return int(cfg["factor"]), 1
    if "encoder_block_out_channels" in cfg:
        return 2 ** (len(cfg["encoder_block_out_channels"]) - 1), 1
    if "temperal_downsample" in cfg:
        return 2 ** len(cfg["temperal_downsample"]), 2 ** sum(map(bool, cfg["temperal_downsample"]))
    return 2 ** (len(cfg["block_out_channels"]) - 1), 1


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def meta_transformer(arch: Architecture, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The transformer on the meta device (no memory), in `dtype`."""
    from sanarl.models import tiny_video  # noqa: F401  (registers the tiny video transformer class)

    cls = _find_class(arch.transformer_class)
    config = {k: v for k, v in arch.transformer_config.items() if not k.startswith("_")}
    with torch.device("meta"):
        module = cls.from_config(config)
    return nn.Module.to(module, dtype)  # nn.Module's own `to`: diffusers' warns about fp32-kept modules


def _find_class(name: str) -> type:
    import diffusers

    from sanarl.models import tiny_video

    for where in (diffusers, tiny_video):
        if hasattr(where, name):
            return getattr(where, name)
    raise ConfigError(
        f"transformer class {name!r} is not one sanarl can plan (diffusers' or sanarl's tiny ones)."
    )


def example_inputs(
    module: nn.Module, arch: Architecture, batch: int, size: tuple[int, int], frames: int, text_len: int
) -> dict:
    """Meta tensors for one forward of `module` on `batch` samples of `size` (H, W) (and `frames` for video) with
    `text_len` prompt tokens, shaped as sanarl's family adapters call it."""
    from diffusers import FluxTransformer2DModel, SanaVideoTransformer3DModel, SD3Transformer2DModel

    cfg, dtype = module.config, next(module.parameters()).dtype
    h, w = size[0] // arch.spatial_factor, size[1] // arch.spatial_factor

    def meta(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    t = meta(batch, dt=torch.float32)
    if isinstance(module, FluxTransformer2DModel):
        tokens = (h // 2) * (w // 2)
        extra = {"guidance": t} if cfg.guidance_embeds else {}
        return dict(hidden_states=meta(batch, tokens, cfg.in_channels), encoder_hidden_states=meta(
            batch, text_len, cfg.joint_attention_dim), pooled_projections=meta(batch, cfg.pooled_projection_dim),
            timestep=t, img_ids=meta(tokens, 3, dt=torch.float32), txt_ids=meta(text_len, 3, dt=torch.float32),
            return_dict=False, **extra)  # fmt: skip
    if isinstance(module, SD3Transformer2DModel):
        return dict(hidden_states=meta(batch, cfg.in_channels, h, w), encoder_hidden_states=meta(
            batch, 77 + text_len, cfg.joint_attention_dim), pooled_projections=meta(batch, cfg.pooled_projection_dim),
            timestep=t, return_dict=False)  # fmt: skip
    if isinstance(module, SanaVideoTransformer3DModel):
        latent_frames = (frames - 1) // arch.temporal_factor + 1
        x = meta(batch, cfg.in_channels, latent_frames, h, w)
    else:
        x = meta(batch, cfg.in_channels, h, w)
    return dict(hidden_states=x, encoder_hidden_states=meta(batch, text_len, cfg.caption_channels),
                encoder_attention_mask=meta(batch, text_len, dt=torch.float32), timestep=t,
                return_dict=False)  # fmt: skip


def default_lora_targets(arch: Architecture) -> list[str]:
    """The family adapter's LoRA targets (used when `[policy.lora].target_modules` is empty)."""
    from sanarl.models import ADAPTERS, _adapter_class

    if arch.pipeline_class not in ADAPTERS:
        raise ConfigError(f"{arch.name}: pipeline class {arch.pipeline_class} is not supported; sanarl supports "
                          + ", ".join(ADAPTERS))  # fmt: skip
    return list(_adapter_class(arch.pipeline_class).default_lora_targets)


def depth_variants(arch: Architecture) -> tuple[Architecture, list[tuple[int, Architecture, Architecture]]]:
    """The architecture cut to its shallowest form, and per kind of repeated block: its count in the full model and
    the shallow form with one and with two more blocks of that kind. Past the first block of a kind, memory and
    FLOPs grow by the same amount per block, so `base + (one - base) + (count - 1) x (two - one)` gives the full
    model's figures from a few shallow traces (checked against full traces in tests/unit/test_capacity.py).

    Kinds: SANA / SANA-Video blocks (`num_layers`); FLUX.1's double- and single-stream blocks (`num_layers`,
    `num_single_layers`); SD3's joint blocks with and without dual attention (the last block, which has no context
    output, stays in the base)."""
    cfg = arch.transformer_config

    def cut(**values) -> Architecture:
        return Architecture(**{**arch.__dict__, "transformer_config": {**cfg, **values}})

    if arch.transformer_class == "FluxTransformer2DModel":
        return cut(num_layers=1, num_single_layers=1), [
            (cfg["num_layers"] - 1, cut(num_layers=2, num_single_layers=1), cut(num_layers=3, num_single_layers=1)),
            (cfg["num_single_layers"] - 1, cut(num_layers=1, num_single_layers=2),
             cut(num_layers=1, num_single_layers=3)),
        ]  # fmt: skip
    if arch.transformer_class == "SD3Transformer2DModel":
        layers = cfg["num_layers"]
        dual = [i for i in cfg.get("dual_attention_layers", ()) if i < layers - 1]
        return cut(num_layers=1, dual_attention_layers=()), [
            (len(dual), cut(num_layers=2, dual_attention_layers=(0,)), cut(num_layers=3, dual_attention_layers=(0, 1))),
            (layers - 1 - len(dual), cut(num_layers=2, dual_attention_layers=()),
             cut(num_layers=3, dual_attention_layers=())),
        ]  # fmt: skip
    return cut(num_layers=1), [(cfg["num_layers"] - 1, cut(num_layers=2), cut(num_layers=3))]
