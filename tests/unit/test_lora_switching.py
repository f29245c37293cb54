"""Adapter switching on cached LoRA layers (`sanarl.core.lora.activate_adapter`, `adapters_disabled`) does what
diffusers' `set_adapter` / `disable_adapters` / `enable_adapters` do over every submodule: the same forward
outputs, the same active adapter in every layer, and the requires_grad flags kept (activate) or set as diffusers
sets them (disable / enable)."""

from __future__ import annotations

import copy

import pytest
import torch

from sanarl.core.lora import activate_adapter, adapters_disabled, add_lora_adapters, tuner_layers

TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj"]


def _transformer() -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    module = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16,
        pos_embed_max_size=8,
    )  # fmt: skip
    add_lora_adapters(module, ["default", "old"], r=2, alpha=4, init="gaussian", target_modules=TARGETS)
    with torch.no_grad():  # the adapters differ (and are nonzero), so each switch changes the output
        for name, param in module.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5 if ".old." in name else 0.1)
    return module


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 5, 16, generator=g),
        "pooled_projections": torch.randn(2, 16, generator=g),
        "timestep": torch.tensor([500.0, 250.0]),
    }


def _flags(module: torch.nn.Module) -> dict[str, bool]:
    return {k: p.requires_grad for k, p in module.named_parameters()}


def _active(module: torch.nn.Module) -> list[list[str]]:
    return [list(layer.active_adapters) for layer in tuner_layers(module)]


def _diffusers_activate(module: torch.nn.Module, name: str) -> None:
    """The switch as sanarl made it before: diffusers' set_adapter over every submodule, flags put back."""
    flags = _flags(module)
    module.set_adapter(name)
    for k, p in module.named_parameters():
        p.requires_grad_(flags[k])


@pytest.mark.parametrize("name", ["old", "default"])
def test_activate_adapter_matches_diffusers_set_adapter(name):
    fast = _transformer()
    slow = copy.deepcopy(fast)
    activate_adapter(fast, "old" if name == "default" else "default")  # start from the other adapter
    _diffusers_activate(slow, "old" if name == "default" else "default")
    activate_adapter(fast, name)
    _diffusers_activate(slow, name)
    assert _active(fast) == _active(slow) == [[name]] * len(tuner_layers(fast))
    assert _flags(fast) == _flags(slow)
    assert any(_flags(fast).values())  # only "default" trains, whichever adapter is active
    assert all(not v for k, v in _flags(fast).items() if ".old." in k)
    with torch.no_grad():
        assert torch.equal(fast(**_inputs())[0], slow(**_inputs())[0])


def test_the_active_adapter_decides_the_output():
    module = _transformer()
    with torch.no_grad():
        activate_adapter(module, "default")
        default = module(**_inputs())[0]
        activate_adapter(module, "old")
        old = module(**_inputs())[0]
    assert not torch.allclose(default, old)


def test_adapters_disabled_matches_diffusers_disable_and_enable():
    fast = _transformer()
    slow = copy.deepcopy(fast)
    with torch.no_grad():
        with adapters_disabled(fast):
            fast_ref = fast(**_inputs())[0]
            fast_flags = _flags(fast)
        slow.disable_adapters()
        slow_ref, slow_flags = slow(**_inputs())[0], _flags(slow)
        slow.enable_adapters()
        fast_on, slow_on = fast(**_inputs())[0], slow(**_inputs())[0]
    assert torch.equal(fast_ref, slow_ref)
    assert fast_flags == slow_flags
    assert torch.equal(fast_on, slow_on)
    assert _flags(fast) == _flags(slow)
    assert all(not layer.disable_adapters for layer in tuner_layers(fast))
    base = copy.deepcopy(fast)  # the base model's output: every LoRA scaled to zero
    with torch.no_grad():
        for name, param in base.named_parameters():
            if "lora_B" in name:
                param.zero_()
        assert torch.allclose(base(**_inputs())[0], fast_ref, atol=1e-6)


def test_the_layer_cache_follows_new_adapters():
    module = _transformer()
    before = list(tuner_layers(module))
    add_lora_adapters(module, ["extra"], r=2, alpha=4, init="gaussian", target_modules=["attn.to_add_out"],
                      trainable="extra")  # fmt: skip
    after = tuner_layers(module)
    assert len(after) > len(before)  # to_add_out layers are new LoRA layers
    activate_adapter(module, "old")
    assert all(layer.active_adapters == ["old"] for layer in after)
