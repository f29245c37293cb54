"""The real transformer architectures of the shipped presets, as test data, and their builder on the meta device.

Each config is the model's Hub `transformer/config.json` (written out here; no download). `PUBLISHED` holds each
model's published size, so a wrong config shows as a parameter count off the publication. Build one with
`build(name)`: every layer and shape, no memory, no weights. Shared by the meta-device tests of every family."""

from __future__ import annotations

from typing import Any

import diffusers
import torch
from torch import nn

SANA_1600M = {
    "_class_name": "SanaTransformer2DModel", "sample_size": 32, "patch_size": 1, "num_layers": 20,
    "num_attention_heads": 70, "attention_head_dim": 32, "num_cross_attention_heads": 20,
    "cross_attention_head_dim": 112, "cross_attention_dim": 2240, "caption_channels": 2304, "in_channels": 32,
    "out_channels": 32, "attention_bias": False, "qk_norm": "rms_norm_across_heads", "mlp_ratio": 2.5,
    "dropout": 0.0, "norm_elementwise_affine": False, "norm_eps": 1e-06, "interpolation_scale": None,
    "guidance_embeds": False, "guidance_embeds_scale": 0.1, "timestep_scale": 1.0,
}  # fmt: skip
CONFIGS: dict[str, dict[str, Any]] = {
    "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers": SANA_1600M,
    "Efficient-Large-Model/SANA1.5_4.8B_1024px_diffusers": {**SANA_1600M, "num_layers": 60},
    "Efficient-Large-Model/SANA-Video_2B_480p_diffusers": {
        "_class_name": "SanaVideoTransformer3DModel", "attention_bias": False, "attention_head_dim": 112,
        "caption_channels": 2304, "cross_attention_dim": 2240, "cross_attention_head_dim": 112, "dropout": 0.0,
        "guidance_embeds": False, "guidance_embeds_scale": 0.1, "in_channels": 16, "interpolation_scale": None,
        "mlp_ratio": 3.0, "norm_elementwise_affine": False, "norm_eps": 1e-06, "num_attention_heads": 20,
        "num_cross_attention_heads": 20, "num_layers": 20, "out_channels": 16, "patch_size": [1, 2, 2],
        "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "sample_size": 30,
    },
    "stabilityai/stable-diffusion-3.5-medium": {
        "_class_name": "SD3Transformer2DModel", "attention_head_dim": 64, "caption_projection_dim": 1536,
        "dual_attention_layers": list(range(13)), "in_channels": 16, "joint_attention_dim": 4096,
        "num_attention_heads": 24, "num_layers": 24, "out_channels": 16, "patch_size": 2,
        "pooled_projection_dim": 2048, "pos_embed_max_size": 384, "qk_norm": "rms_norm", "sample_size": 128,
    },
    "stabilityai/stable-diffusion-3.5-large": {
        "_class_name": "SD3Transformer2DModel", "attention_head_dim": 64, "caption_projection_dim": 2432,
        "dual_attention_layers": [], "in_channels": 16, "joint_attention_dim": 4096, "num_attention_heads": 38,
        "num_layers": 38, "out_channels": 16, "patch_size": 2, "pooled_projection_dim": 2048,
        "pos_embed_max_size": 192, "qk_norm": "rms_norm", "sample_size": 128,
    },
    "black-forest-labs/FLUX.1-dev": {
        "_class_name": "FluxTransformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56],
        "guidance_embeds": True, "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24,
        "num_layers": 19, "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768,
    },
}  # fmt: skip
"""Hub id -> transformer config."""

PUBLISHED = {
    "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers": 1.6e9,
    "Efficient-Large-Model/SANA1.5_4.8B_1024px_diffusers": 4.8e9,
    "Efficient-Large-Model/SANA-Video_2B_480p_diffusers": 2.0e9,
    "stabilityai/stable-diffusion-3.5-medium": 2.5e9,  # "2.5 billion parameters" counts the MMDiT-X with its embedders
    "stabilityai/stable-diffusion-3.5-large": 8.1e9,
    "black-forest-labs/FLUX.1-dev": 12e9,
}
"""Hub id -> the parameter count its model card states."""


def build(name: str) -> nn.Module:
    """The transformer of Hub id `name` on the meta device."""
    config = CONFIGS[name]
    cls = getattr(diffusers, config["_class_name"])
    with torch.device("meta"):
        return cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def layers_by_suffix(names: list[str]) -> dict[str, int]:
    """How many of `names` end in each block-relative suffix (`transformer_blocks.3.attn2.to_k` -> `attn2.to_k`)."""
    counts: dict[str, int] = {}
    for name in names:
        parts = name.split(".")
        suffix = ".".join(parts[2:]) if len(parts) > 2 and parts[1].isdigit() else name
        counts[suffix] = counts.get(suffix, 0) + 1
    return counts
