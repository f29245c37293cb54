"""LoRA adapters through peft, with named adapters and explicit switching.

RL tasks keep two adapters on the same base weights: "default" (trained, theta) and "old" (behaviour policy,
theta_old); the reference model is the base with adapters disabled. Only the "default" adapter requires grad.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def add_lora_adapters(
    module: nn.Module,
    names: list[str],
    *,
    r: int,
    alpha: float,
    init: bool | str,
    target_modules: list[str],
    dropout: float = 0.0,
    trainable: str = "default",
    check: bool = True,
) -> None:
    """Inject one LoRA adapter per name; every adapter starts from the same weights as `trainable`. `check`: every
    target must name a layer (`check_targets`); the memory plan's shortened stacks of blocks turn it off."""
    from peft import LoraConfig

    if check:
        check_targets(module, target_modules)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        init_lora_weights=init,
        target_modules=list(target_modules),
        lora_dropout=dropout,
    )
    ordered = [trainable] + [n for n in names if n != trainable]
    with (
        warnings.catch_warnings()
    ):  # peft warns that a second adapter makes the model multi-adapter: intended
        warnings.filterwarnings("ignore", message=".*multiple adapters.*")
        for name in ordered:
            module.add_adapter(config, adapter_name=name)
    for param in lora_parameters(
        module
    ).values():  # adapters train in float32 over a low-precision frozen base
        if param.dtype != torch.float32:
            param.data = param.data.float()
    for name in ordered[1:]:
        copy_adapter(module, src=trainable, dst=name)
    activate_adapter(module, trainable)
    for pname, param in module.named_parameters():
        param.requires_grad_(f".{trainable}." in pname and "lora_" in pname)


def check_targets(module: nn.Module, target_modules: list[str]) -> None:
    """Every `[policy.lora].target_modules` entry names modules of `module` (peft's rule: the whole name or its
    dotted suffix); raises UserError listing a few real names otherwise."""
    from sanarl.errors import UserError

    names = [n for n, _ in module.named_modules()]
    unmatched = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if unmatched:
        linear = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
        suffixes = list(dict.fromkeys(".".join(n.split(".")[-2:]) for n in linear))
        raise UserError(
            f"`policy.lora.target_modules` entries {unmatched} match no layer of the model; real layer names end "
            f"in e.g. {', '.join(suffixes[:8])}. Fix the names, or leave target_modules empty for the model "
            "family's default."
        )


def adapter_parameters(module: nn.Module, name: str) -> dict[str, nn.Parameter]:
    """The LoRA parameters of adapter `name`, keyed by parameter name."""
    return {k: p for k, p in module.named_parameters() if "lora_" in k and f".{name}." in k}


def lora_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """Every LoRA parameter of every adapter."""
    return {k: p for k, p in module.named_parameters() if "lora_" in k}


@torch.no_grad()
def copy_adapter(module: nn.Module, src: str, dst: str) -> None:
    """dst <- src, parameter by parameter."""
    src_params = adapter_parameters(module, src)
    for k, p in adapter_parameters(module, dst).items():
        p.copy_(src_params[k.replace(f".{dst}.", f".{src}.")])


_TUNER_LAYERS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[str, ...], list[nn.Module]]] = (
    weakref.WeakKeyDictionary()
)
"""Per model: its adapter names when last scanned, and its peft tuner layers in `named_modules` order."""


def tuner_layers(module: nn.Module) -> list[nn.Module]:
    """The peft LoRA layers of `module` (what diffusers' `set_adapter` / `disable_adapters` visit), found once per
    set of adapter names: switching adapters then costs a walk over these layers, not over every submodule."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    names = tuple(getattr(module, "peft_config", {}))
    cached = _TUNER_LAYERS.get(module)
    if cached is None or cached[0] != names:
        cached = (names, [m for m in module.modules() if isinstance(m, BaseTunerLayer)])
        _TUNER_LAYERS[module] = cached
    return cached[1]


def activate_adapter(module: nn.Module, name: str) -> None:
    """Make `name` the adapter used by forward (keeps requires_grad flags as they are). The same calls as diffusers'
    `set_adapter` (each LoRA layer's `set_adapter([name])`), on the cached layers; the flags peft's `set_adapter`
    changes (the active adapter becomes trainable) are put back, layer by layer."""
    if name not in getattr(module, "peft_config", {}):
        module.set_adapter(name)  # diffusers' own error: no such adapter
    for layer in tuner_layers(module):
        params = list(layer.parameters())
        flags = [p.requires_grad for p in params]
        layer.set_adapter([name])
        for param, flag in zip(params, flags, strict=True):
            param.requires_grad_(flag)


@contextmanager
def using_adapter(module: nn.Module, name: str, restore: str = "default") -> Iterator[None]:
    """Forward with adapter `name` inside the block, then switch back to `restore`."""
    activate_adapter(module, name)
    try:
        yield
    finally:
        activate_adapter(module, restore)


@contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """Forward with the base weights only (the reference model): diffusers' `disable_adapters` /
    `enable_adapters` calls (each LoRA layer's `enable_adapters(False / True)`) on the cached layers."""
    layers = tuner_layers(module)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def diffusers_lora_state_dict(module: nn.Module, name: str = "default") -> dict[str, torch.Tensor]:
    """Adapter `name` in peft's saved format (keys without the adapter name), ready for `save_lora_weights`."""
    from peft.utils import get_peft_model_state_dict

    return {
        k: v.detach().cpu().contiguous()
        for k, v in get_peft_model_state_dict(module, adapter_name=name).items()
    }
