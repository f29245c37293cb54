"""LoRA adapters through peft, with named adapters and explicit switching.

RL tasks keep two adapters on the same base weights: "default" (trained, theta) and "old" (behaviour policy,
theta_old); the reference model is the base with adapters disabled. Only the "default" adapter requires grad.
"""

from __future__ import annotations

import warnings
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


def activate_adapter(module: nn.Module, name: str) -> None:
    """Make `name` the adapter used by forward (keeps requires_grad flags as they are)."""
    flags = {k: p.requires_grad for k, p in module.named_parameters()}
    module.set_adapter(name)
    for k, p in module.named_parameters():  # peft's set_adapter marks the active adapter trainable
        p.requires_grad_(flags[k])


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
    """Forward with the base weights only (the reference model)."""
    module.disable_adapters()
    try:
        yield
    finally:
        module.enable_adapters()


def diffusers_lora_state_dict(module: nn.Module, name: str = "default") -> dict[str, torch.Tensor]:
    """Adapter `name` in peft's saved format (keys without the adapter name), ready for `save_lora_weights`."""
    from peft.utils import get_peft_model_state_dict

    return {
        k: v.detach().cpu().contiguous()
        for k, v in get_peft_model_state_dict(module, adapter_name=name).items()
    }
