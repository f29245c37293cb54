"""Low-precision linear layers for Sol-RL's quantized rollout copies (the sol_rl preview, the naive_quant copy).

`rollout.preview_precision` names the precision; the machine decides the backend (`backend_for`):

| precision | backend                                                                                      |
|-----------|----------------------------------------------------------------------------------------------|
| nvfp4     | transformer-engine on Blackwell (sm_100+)                                                    |
| fp8       | transformer-engine when it imports, else torch-native FP8 (`torch._scaled_mm`, e4m3 weights and |
|           | activations, per-tensor scales) on an sm_89+ GPU (Ada / Hopper)                              |
| int8      | dynamic int8 on CPU: per-output-channel int8 weights, uint8 activations (per tensor, per call) |
|           | through the quantized engine's `linear_dynamic` kernel, or the same arithmetic emulated      |
| e2m1_delayed | transformer-engine only, on sm_89+: Sol-RL's recipe `DelayedScaling(fp8_format=E2M1,        |
|           | amax_history_len=16)`, which transformer-engine runs as FP8 E5M2 (`TE_RECIPES`)              |
| auto      | the best of those this machine has: nvfp4, then fp8, then int8 on a CPU-only machine          |
| bf16      | no quantization                                                                              |

`check_quantization` runs at start, so a run that cannot quantize stops before any work with the fix. Every backend
replaces the same layers (`eligible_linears`): the linear layers, 1x1 convolutions included (a 1x1 Conv2d is a
linear map over channels: SANA's GLU feed-forward), outside the architecture's skip list (Sol-RL's per model,
`skip_parts`) whose largest side is > `min_dim` (`rollout.nvfp4_min_dim`) and whose sides are multiples of 16.
The side is measured on Sol-RL's native layer where diffusers splits one: SANA's cross-attention `kv_linear`
(2240 -> 4480) is diffusers' `attn2.to_k` + `attn2.to_v`, each measured at the fused width. The quantized layers
keep a high-precision master `weight` (shape `[out, in]`), which `InferenceCopy.refresh` overwrites; the
low-precision form is rebuilt from it on the next forward after each refresh.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from sanarl.errors import UserError

SANA_SKIP = ("patch_embed", "time_embed", "caption_projection", "proj_out", "norm_out", "attn1.to_q", "attn1.to_k",
             "attn1.to_v", "x_embedder", "t_embedder", "y_embedder", "final_layer", "attn.qkv")  # fmt: skip
SKIP_BY_ARCHITECTURE = {
    "FluxTransformer2DModel": ("x_embedder", "context_embedder", "time_text_embed", "norm_out"),
    "SD3Transformer2DModel": ("pos_embed", "context_embedder", "time_text_embed", "norm_out", "norm1", "ff_context"),
}  # fmt: skip
"""Sol-RL's `nvfp4_skip_modules` per transformer class (configs/sol_rl/flux1.py, sd3.py); others: SANA's list
(Sol-RL's sana.py names plus their diffusers equivalents)."""
PRECISIONS = ("nvfp4", "fp8", "e2m1_delayed", "int8", "auto", "bf16")
MIN_CAPABILITY = {"fp8": (8, 9), "e2m1_delayed": (8, 9), "nvfp4": (10, 0)}
GPUS = {
    "fp8": "Hopper or Ada (sm_89+), e.g. H100 / L40S",
    "e2m1_delayed": "Hopper or Ada (sm_89+), e.g. H100 / L40S",
    "nvfp4": "Blackwell (sm_100+), e.g. B200",
}
FP8_MAX = 448.0
"""Largest finite float8_e4m3fn."""


def skip_parts(module: nn.Module) -> tuple[str, ...]:
    """The name parts whose layers stay in high precision for this transformer's architecture."""
    return SKIP_BY_ARCHITECTURE.get(type(module).__name__, SANA_SKIP)


def _has_te() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


def _capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def backend_for(precision: str) -> tuple[str, str] | None:
    """(precision, backend) this machine runs `precision` with: backend "te" | "torch_fp8" | "int8"; None for bf16
    (and for auto on a GPU below sm_89). Raises UserError with the fix when the precision cannot run here."""
    cap = _capability()
    if precision == "auto":
        if cap is None:
            return ("int8", "int8")
        for name in ("nvfp4", "fp8"):
            if cap >= MIN_CAPABILITY[name] and (_has_te() or name == "fp8"):
                return backend_for(name)
        return None
    if precision == "bf16":
        return None
    if precision == "int8":
        return ("int8", "int8")
    fix = f'`rollout.preview_precision = "{precision}"` needs an NVIDIA {GPUS[precision]} GPU'
    if precision == "fp8":
        fix += " (through transformer-engine, or torch-native FP8 without it)"
    elif precision == "e2m1_delayed":
        fix += " with transformer-engine (Sol-RL's DelayedScaling recipe, FP8 E5M2 in effect)"
    else:
        fix += " with transformer-engine"
    if cap is None or cap < MIN_CAPABILITY[precision]:
        raise UserError(
            f'{fix}; this machine has none. Set `rollout.preview_precision = "auto"` (int8 on CPU) or "bf16".'
        )
    if _has_te():
        return (precision, "te")
    if precision == "fp8" and hasattr(torch, "_scaled_mm"):
        return ("fp8", "torch_fp8")
    raise UserError(
        f'{fix} and transformer-engine (pip install "sanarl[te]"), which is not importable here. Install it, or '
        'set `rollout.preview_precision = "fp8"` (torch-native FP8, no transformer-engine) or "bf16".'
    )


def check_quantization(precision: str, family: str) -> None:
    """Raise UserError (exit 2) when `precision` quantization cannot run here (`backend_for`); bf16 always can."""
    if precision not in PRECISIONS:
        raise UserError(
            f"`rollout.preview_precision = {precision!r}`: choose one of {', '.join(PRECISIONS)}."
        )
    try:
        backend_for(precision)
    except UserError as err:
        raise UserError(f'`rollout.family = "{family}"`: {err}') from None


FUSED_WIDTH = {"attn2.to_k": 2, "attn2.to_v": 2}
"""SANA (any architecture not in SKIP_BY_ARCHITECTURE): diffusers layers that are one slice of a fused layer of
Sol-RL's native model, and how many slices it has (cross-attention `kv_linear` = `attn2.to_k` + `attn2.to_v`)."""


def is_channel_linear(layer: nn.Module) -> bool:
    """An nn.Linear, or a 1x1 nn.Conv2d that is a linear map over channels (stride 1, no padding, one group)."""
    if isinstance(layer, nn.Linear):
        return True
    return (
        type(layer) is nn.Conv2d
        and layer.kernel_size == (1, 1)
        and layer.stride == (1, 1)
        and layer.padding in ((0, 0), "valid")
        and layer.dilation == (1, 1)
        and layer.groups == 1
    )


def _sides(layer: nn.Module) -> tuple[int, int]:
    if isinstance(layer, nn.Linear):
        return layer.in_features, layer.out_features
    return layer.in_channels, layer.out_channels


def _measured_width(module: nn.Module, name: str, out_features: int) -> int:
    if type(module).__name__ in SKIP_BY_ARCHITECTURE:
        return out_features
    return out_features * next((n for suffix, n in FUSED_WIDTH.items() if name.endswith(suffix)), 1)


def eligible_linears(module: nn.Module, min_dim: int) -> list[str]:
    """Names of the layers every backend quantizes: linear layers and 1x1 convolutions (`is_channel_linear`)
    outside the skip list, largest side (fused width for split layers, `FUSED_WIDTH`) > min_dim, both sides
    multiples of 16."""
    skip = skip_parts(module)
    names = []
    for name, layer in module.named_modules():
        if not is_channel_linear(layer) or any(part in name for part in skip):
            continue
        n_in, n_out = _sides(layer)
        if max(n_in, _measured_width(module, name, n_out)) <= min_dim or n_in % 16 or n_out % 16:
            continue
        names.append(name)
    return names


@dataclass(frozen=True)
class QuantPlan:
    """What a quantized copy of a transformer replaces: the layer names, out of how many linear layers (1x1
    convolutions included), and the weights they hold out of all parameters."""

    names: list[str]
    candidates: int
    quantized_params: int
    total_params: int

    @property
    def share(self) -> float:
        return self.quantized_params / max(self.total_params, 1)

    def summary(self) -> str:
        return (
            f"{len(self.names)} of {self.candidates} linear layers (1x1 convolutions included), "
            f"{100 * self.share:.1f}% of the weights ({self.quantized_params / 1e6:.0f}M of "
            f"{self.total_params / 1e6:.0f}M parameters)"
        )


def quantization_plan(module: nn.Module, min_dim: int) -> QuantPlan:
    """The layers `quantize_linears` would replace in `module` (works on the meta device: no memory, no weights)."""
    names = eligible_linears(module, min_dim)
    candidates = sum(1 for _, layer in module.named_modules() if is_channel_linear(layer))
    quantized = sum(module.get_submodule(n).weight.numel() for n in names)
    total = sum(p.numel() for p in module.parameters())
    return QuantPlan(names, candidates, quantized, total)


def nothing_to_quantize(module: nn.Module, min_dim: int, what: str) -> UserError:
    """The refusal of a quantized copy that would replace no layer, with the largest side that would qualify."""
    skip = skip_parts(module)
    sides = [
        max(_sides(layer)[0], _measured_width(module, name, _sides(layer)[1]))
        for name, layer in module.named_modules()
        if is_channel_linear(layer) and not any(part in name for part in skip)
    ]
    hint = (
        f"the largest side outside the skip list is {max(sides)}"
        if sides
        else "every layer is on the skip list"
    )
    return UserError(
        f"{what}: its quantized copy of the {type(module).__name__} would quantize no layer: no linear layer (1x1 "
        f"convolutions included) outside the skip list has a side > `rollout.nvfp4_min_dim = {min_dim}` ({hint}). "
        'Lower `rollout.nvfp4_min_dim`, or set `rollout.preview_precision = "bf16"` to run the copy unquantized.'
    )


def model_quant_plan(name: str, revision: str | None, min_dim: int, what: str) -> QuantPlan | None:
    """`quantization_plan` of model `name` built on the meta device from its config (no weights are read); None
    when its config is not here. Raises `nothing_to_quantize` when the copy would replace no layer."""
    from sanarl.models.architecture import meta_transformer, transformer_config

    config = transformer_config(name, revision)
    if config is None:
        return None
    module = meta_transformer(config)
    plan = quantization_plan(module, min_dim)
    if not plan.names:
        raise nothing_to_quantize(module, min_dim, what)
    return plan


def quantize_linears(module: nn.Module, precision: str, *, min_dim: int) -> list[str]:
    """Replace the eligible layers of `module` (`eligible_linears`) by the machine's low-precision layers for
    `precision`. Returns the replaced names."""
    chosen = backend_for(precision)
    if chosen is None:
        return []
    precision, backend = chosen
    device = next(module.parameters()).device
    if backend == "int8" and device.type != "cpu":
        raise UserError(
            f'`rollout.preview_precision = "int8"` is the CPU backend (dynamic int8 linear layers); this run samples '
            f'on {device.type}: use "fp8" (sm_89+ GPUs), "auto" or "bf16".'
        )
    names = eligible_linears(module, min_dim)
    if not names:
        raise nothing_to_quantize(module, min_dim, f'`rollout.preview_precision = "{precision}"`')
    if backend == "te":
        return _te_linears(module, names, precision)
    layer_cls = Int8DynamicLinear if backend == "int8" else Fp8Linear
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, layer_cls(getattr(parent, child)))
    module._sanarl_quantized = backend
    return names


class _RepackingLinear(nn.Module):
    """A linear layer with a high-precision master `weight` `[out, in]` / `bias` and a low-precision form rebuilt
    from the master whenever it changed (tracked through the tensor's in-place version counter). Built from an
    nn.Linear, or from a 1x1 nn.Conv2d: then it maps channels-first inputs `[B, C, ...]` over dim 1, as the
    convolution does."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.in_features, self.out_features = _sides(layer)
        self.channels_first = not isinstance(layer, nn.Linear)
        weight = layer.weight.detach().reshape(self.out_features, self.in_features)
        self.weight = nn.Parameter(weight.clone(), requires_grad=False)
        self.bias = (
            None if layer.bias is None else nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
        )
        self._packed = None
        self._packed_version = None

    def _version(self) -> tuple[int, int]:
        return (self.weight._version, -1 if self.bias is None else self.bias._version)

    def packed(self):
        if self._packed is None or self._packed_version != self._version():
            with torch.no_grad():
                self._packed = self._pack()
            self._packed_version = self._version()
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_first:
            return self._linear(x.movedim(1, -1)).movedim(-1, 1)
        return self._linear(x)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
            + (", channels_first=True" if self.channels_first else "")
        )


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """x -> (q, scale, zero point): per-tensor affine uint8 over [min(x, 0), max(x, 0)], as torch's dynamic linear."""
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = max((hi - lo) / 255.0, 1e-12)
    zero = round(-lo / scale)
    return torch.clamp(torch.round(x / scale) + zero, 0, 255), scale, zero


def _int8_weight_scale(w: torch.Tensor) -> torch.Tensor:
    """Per output channel: max |W_row| / 127 (symmetric int8)."""
    return (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)


def _int8_weight(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`round(W / scale)` per output channel, clamped to +-127 (float, for the emulated arithmetic)."""
    return torch.round(w / scale[:, None]).clamp(-127, 127)


def _int8_kernel_pack(w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    """W quantized per output channel with `scale` and packed for torch's dynamic int8 linear kernel (CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch marks its quantized tensor creation as deprecated
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(w.cpu(), scale.double().cpu(), zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, bias)


def _int8_emulated(x: torch.Tensor, q_w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic without it: x quantized per call (`quantize_activation`), int8 weights `q_w`
    (`_int8_weight`), products rescaled; no bias."""
    q_x, x_scale, zero = quantize_activation(x)
    return ((q_x - zero) @ q_w.t()) * (x_scale * w_scale[None, :])


class Int8DynamicLinear(_RepackingLinear):
    """y = x W^T + b with W quantized to int8 per output channel (symmetric, scale max|W_row| / 127) and x to uint8
    per call (`quantize_activation`): the CPU quantized engine's dynamic linear kernel, or the same arithmetic
    emulated where the kernel is missing."""

    def _pack(self):
        w = self.weight.float()
        scale = _int8_weight_scale(w)
        if _kernel_available():
            bias = None if self.bias is None else self.bias.float().cpu()
            return ("kernel", _int8_kernel_pack(w, scale, bias))
        return ("emulated", (_int8_weight(w, scale), scale))

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        kind, packed = self.packed()
        flat = x.reshape(-1, self.in_features).float().contiguous()
        if kind == "kernel":
            out = torch.ops.quantized.linear_dynamic(flat, packed, False)
        else:
            out = _int8_emulated(flat, *packed)
            if self.bias is not None:
                out = out + self.bias.float()
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


@functools.cache
def _kernel_available() -> bool:
    """Whether torch's CPU quantized engine runs a dynamic int8 linear here that computes this module's formula
    (`quantize_activation` over the full uint8 range, the weight per output channel). Checked on a small probe
    against the emulated arithmetic: some engine / CPU pairs run a different one (on an AVX2 CPU without VNNI,
    torch 2.14's x86 / fbgemm / onednn kernels are off by whole units), and the emulated path then serves."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 64, generator=generator)
    x = torch.randn(4, 64, generator=generator) * 2 + 0.3
    scale = _int8_weight_scale(weight)
    try:
        out = torch.ops.quantized.linear_dynamic(x, _int8_kernel_pack(weight, scale, None), False)
    except Exception:
        return False
    formula = _int8_emulated(x, _int8_weight(weight, scale), scale)
    return bool(torch.allclose(out, formula, rtol=1e-4, atol=1e-4))


class Fp8Linear(_RepackingLinear):
    """y = x W^T + b in FP8 e4m3 on sm_89+ GPUs through `torch._scaled_mm`: per-tensor scales, the weight's from its
    absolute maximum, the activation's per call; bf16 output."""

    def _pack(self):
        w = self.weight.float()
        scale = (w.abs().max() / FP8_MAX).clamp_min(1e-12)
        q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        return q, scale.reshape(()), bias

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        q_w, w_scale, bias = self.packed()
        flat = x.reshape(-1, self.in_features).float()
        x_scale = (flat.abs().max() / FP8_MAX).clamp_min(1e-12)
        q_x = (flat / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(
            q_x, q_w.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=torch.bfloat16
        )
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


TE_RECIPES: dict[str, tuple[str, dict[str, object]]] = {
    "nvfp4": ("NVFP4BlockScaling", {}),
    "fp8": ("DelayedScaling", {}),
    "e2m1_delayed": (
        "DelayedScaling",
        {"fp8_format": "E2M1", "amax_history_len": 16, "amax_compute_algo": "max"},
    ),
}
"""transformer-engine recipe per precision: (class in `transformer_engine.common.recipe`, keyword arguments; a
`fp8_format` names a `Format` member). `e2m1_delayed` is Sol-RL's `NVFP4_RECIPE` as written: DelayedScaling accepts
`Format.E2M1`, and its quantizers then take E5M2 (`get_fp8_te_dtype` returns E4M3 only for E4M3 / HYBRID forward),
so it computes FP8 E5M2 with per-tensor delayed scaling, amax = max over the last 16 steps (docs/nft.md)."""


def te_recipe(precision: str):
    """The transformer-engine recipe object for `precision` (`TE_RECIPES`); needs transformer-engine."""
    from transformer_engine.common import recipe as recipes

    cls_name, kwargs = TE_RECIPES[precision]
    if "fp8_format" in kwargs:
        kwargs = {**kwargs, "fp8_format": recipes.Format[kwargs["fp8_format"]]}
    return getattr(recipes, cls_name)(**kwargs)


class _ChannelsFirst(nn.Module):
    """A transformer-engine Linear applied over dim 1 of `[B, C, ...]` inputs: the stand-in for a 1x1 Conv2d."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.movedim(1, -1).contiguous()).movedim(-1, 1)  # TE views its input as 2-D


def _te_linears(module: nn.Module, names: list[str], precision: str) -> list[str]:
    """transformer-engine Linear layers (bf16 master weights) and the module's forward under TE's autocast with
    the precision's recipe (`TE_RECIPES`)."""
    import transformer_engine.pytorch as te

    for name in names:
        layer = module.get_submodule(name)
        n_in, n_out = _sides(layer)
        new = te.Linear(n_in, n_out, bias=layer.bias is not None, params_dtype=torch.bfloat16,
                        device=layer.weight.device)  # fmt: skip
        with torch.no_grad():
            new.weight.copy_(layer.weight.reshape(n_out, n_in))
            if layer.bias is not None:
                new.bias.copy_(layer.bias)
        parent_name, _, child = name.rpartition(".")
        wrapped = new if isinstance(layer, nn.Linear) else _ChannelsFirst(new)
        setattr(module.get_submodule(parent_name) if parent_name else module, child, wrapped)
    forward = module.forward
    recipe = te_recipe(precision)

    @functools.wraps(forward)
    def low_precision_forward(*args, **kwargs):
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            return forward(*args, **kwargs)

    module.forward = low_precision_forward
    module._sanarl_quantized = "te"
    return names
