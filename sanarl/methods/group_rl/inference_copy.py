"""Inference copies of the behaviour policy for Sol-RL's rollout families (docs/algorithms.md, "Sol-RL rollout
families").

An inference copy is a separate transformer whose linear layers carry the "old" adapter merged into their weights
(W = W_base + scale * B_old A_old), optionally quantized (sanarl/methods/group_rl/quantize.py: transformer-engine FP8 / NVFP4,
torch-native FP8 or CPU int8) and torch.compile'd. It is refreshed in place after every old-adapter update, so it
always equals theta_old.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from sanarl.errors import UserError


def _lora_layers(module: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def merged_weight(layer: nn.Module, adapter: str) -> torch.Tensor:
    """W_base + delta(adapter) of one peft LoRA linear layer."""
    base = layer.get_base_layer().weight
    if adapter not in layer.lora_A:
        return base.detach().clone()
    return base + layer.get_delta_weight(adapter).to(base.dtype)


class InferenceCopy:
    """A merged (and optionally compiled / quantized) copy of `live` with adapter `adapter` folded in."""

    def __init__(
        self,
        live: nn.Module,
        adapter: str = "old",
        *,
        dtype: torch.dtype | None = None,
        compile_mode: str | None = None,
        quantize: str | None = None,
        min_quant_dim: int = 0,
    ) -> None:
        self.adapter = adapter
        self.module = copy.deepcopy(live).eval().requires_grad_(False)
        self.names = list(_lora_layers(self.module))
        for name in self.names:  # replace each LoRA wrapper by its plain base layer
            parent_name, _, child = name.rpartition(".")
            parent = self.module.get_submodule(parent_name) if parent_name else self.module
            setattr(parent, child, getattr(parent, child).get_base_layer())
        if hasattr(self.module, "peft_config"):
            del self.module.peft_config
            self.module._hf_peft_config_loaded = False
        if dtype is not None:
            self.module.to(dtype)
        self.refresh(live)
        if quantize is not None:
            from sanarl.methods.group_rl.quantize import quantize_linears

            quantize_linears(self.module, quantize, min_dim=min_quant_dim)
        self.forward_module: nn.Module = self.module
        if compile_mode is not None:
            self.forward_module = torch.compile(self.module, mode=compile_mode)

    @torch.no_grad()
    def refresh(self, live: nn.Module) -> None:
        """Copy theta_old = base + old adapter from the live model into the copy's merged weights."""
        layers = _lora_layers(live)
        for name in self.names:
            # nn.Linear / nn.Conv2d, or a quantized layer's high-precision master (`[out, in]` for a 1x1 conv)
            target = self.module.get_submodule(name)
            merged = merged_weight(layers[name], self.adapter)
            target.weight.copy_(merged.reshape(target.weight.shape).to(target.weight.dtype))
            base_bias = layers[name].get_base_layer().bias
            if base_bias is not None:
                target.bias.copy_(base_bias.to(target.bias.dtype))


def require_lora_for_copy(uses_lora: bool, family: str) -> None:
    if not uses_lora:
        raise UserError(
            f"rollout.family = {family!r} builds inference copies of the old LoRA adapter; add a [policy.lora] "
            'table with lora_names = ["default", "old"].'
        )
