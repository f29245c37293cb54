"""Low-precision linear layers for Sol-RL's quantized rollout copies, through NVIDIA transformer-engine.

FP8 (Hopper / Ada, sm_89+) or NVFP4 (Blackwell, sm_100+). transformer-engine is an optional GPU-only extra
(`pip install "sanarl[te]"`), imported lazily; `check_quantization` runs at start so a run that cannot quantize
stops before any work with the fix (install it, use such a GPU, or `rollout.preview_precision = "bf16"`).
Sensitive modules (embedders, caption projection, final layer, the self-attention q/k/v, Sol-RL's `attn.qkv`) and
layers whose largest dimension is <= `min_dim` stay in high precision.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from sanarl.errors import UserError

SKIP_PARTS = ("patch_embed", "time_embed", "caption_projection", "proj_out", "norm_out", "attn1.to_q", "attn1.to_k",
              "attn1.to_v", "x_embedder", "t_embedder", "y_embedder", "final_layer", "attn.qkv")  # fmt: skip
MIN_CAPABILITY = {"fp8": (8, 9), "nvfp4": (10, 0)}
GPUS = {"fp8": "Hopper or Ada (sm_89+), e.g. H100 / L40S", "nvfp4": "Blackwell (sm_100+), e.g. B200"}


def check_quantization(precision: str, family: str) -> None:
    """Raise UserError (exit 2) when `precision` quantization cannot run here; bf16 always can."""
    if precision == "bf16":
        return
    fix = (
        f'`rollout.family = "{family}"` quantizes with `rollout.preview_precision = "{precision}"`, which needs '
        f'transformer-engine (pip install "sanarl[te]") on an NVIDIA {GPUS[precision]} GPU'
    )
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as err:
        raise UserError(
            f"{fix}; it is not importable here ({type(err).__name__}). Install it on such a machine, or set "
            '`rollout.preview_precision = "bf16"` to run the two-stage search with an unquantized, fewer-step '
            "preview on any device."
        ) from None
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY[precision]:
        raise UserError(f'{fix}; this machine has none. Set `rollout.preview_precision = "bf16"` elsewhere.')


def _recipe(precision: str):
    from transformer_engine.common import recipe

    return recipe.NVFP4BlockScaling() if precision == "nvfp4" else recipe.DelayedScaling()


def quantize_linears(module: nn.Module, precision: str, *, min_dim: int) -> list[str]:
    """Replace eligible nn.Linear layers by transformer-engine Linear layers (bf16 master weights) and make the
    module's forward run under TE's low-precision autocast. Returns the replaced names."""
    import transformer_engine.pytorch as te

    replaced = []
    for name, layer in list(module.named_modules()):
        if not isinstance(layer, nn.Linear) or any(part in name for part in SKIP_PARTS):
            continue
        if (
            max(layer.in_features, layer.out_features) <= min_dim
            or layer.in_features % 16
            or layer.out_features % 16
        ):
            continue
        new = te.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                        params_dtype=torch.bfloat16, device=layer.weight.device)  # fmt: skip
        with torch.no_grad():
            new.weight.copy_(layer.weight)
            if layer.bias is not None:
                new.bias.copy_(layer.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, child, new)
        replaced.append(name)
    forward = module.forward
    recipe = _recipe(precision)

    @functools.wraps(forward)
    def low_precision_forward(*args, **kwargs):
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            return forward(*args, **kwargs)

    module.forward = low_precision_forward
    module._sanarl_quantized = True
    return replaced
