"""Peak activation memory and FLOPs of one transformer call, computed on the meta device (no memory, no weights).

The forward (and backward) of the real architecture runs on meta tensors under a dispatch mode that keeps the
allocator's books: every new storage an operator returns is counted while a tensor still refers to it and released
when the last one is gone (weak references), so the peak is the one the same graph reaches on a device, for the
activations alone (parameters, and gradients already allocated by an earlier micro-batch, are created outside the
mode and not counted). Attention is accounted as the fused kernels a GPU (and torch's CPU flash kernel) run: the
output and the log-sum-exp, never the L x S score matrix. FLOPs come from torch.utils.flop_counter in the same pass.

Kernels that hold memory of their own while they run are counted for the machine the plan is for (`Kernels`): on the
CPU, oneDNN's convolution reorders a bfloat16 / float16 weight into its blocked layout at every call, a transient
copy of the weight (a float32 weight runs without one; a CPU whose oneDNN does not run that precision runs ATen's
own kernels, not modelled); GPU kernels add nothing here.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

Kernels = Literal["cuda", "cpu"]
"""The machine whose kernels run the traced call: "cuda" (the GPU plan) or "cpu"."""

_CONVOLUTIONS = {torch.ops.aten.convolution.default: 1, torch.ops.aten.convolution_backward.default: 2}
"""Convolution ops -> the position of their weight argument."""


def kernel_workspace(kernels: Kernels, func, args: tuple) -> int:
    """Bytes a kernel holds only while it runs: oneDNN's reordered copy of a reduced-precision convolution weight
    on the CPU (docs/results.md, "Memory plan against measurement"), where this CPU's oneDNN runs that precision;
    0 otherwise."""
    if kernels != "cpu" or func not in _CONVOLUTIONS:
        return 0
    weight = args[_CONVOLUTIONS[func]]
    if not onednn_runs(weight.dtype):
        return 0
    return weight.numel() * weight.element_size()


@functools.cache
def onednn_runs(dtype: torch.dtype) -> bool:
    """Whether torch hands this CPU's convolutions in `dtype` (bfloat16 / float16) to oneDNN, whose reordered
    weight `kernel_workspace` counts. Without the instructions (e.g. AVX2 only, no AVX-512) ATen's own kernels run
    them, with temporary buffers of their own that the CPU plan does not model."""
    checks = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    if dtype not in checks or not torch.backends.mkldnn.is_available():
        return False
    return bool(getattr(torch.ops.mkldnn, checks[dtype])())


class LiveBytes(TorchDispatchMode):
    """Bytes of storages created inside the mode and still referenced; `peak` is their maximum, with each op's
    transient kernel workspace (`kernel_workspace`) on top of what is live when it returns."""

    def __init__(self, kernels: Kernels = "cuda") -> None:
        super().__init__()
        self.kernels = kernels
        self.live = 0
        self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage key -> [tensors alive, bytes]

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            key = _key(t)
            if key in self._refs:
                self._refs[key][0] += 1
            elif key in inputs:
                continue  # a view or in-place result of storage made outside the mode
            else:
                self._refs[key] = [1, t.untyped_storage().nbytes()]
                self.live += self._refs[key][1]
                self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._release, key)
        self.peak = max(self.peak, self.live + kernel_workspace(self.kernels, func, args))
        return out


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _FusedAttention(torch.autograd.Function):
    """Memory and FLOP stand-in of a fused attention kernel: saves q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fused_sdpa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention: the kernel reads each kv head once
        reps = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(reps, -3), value.repeat_interleave(reps, -3)
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return _FusedAttention.apply(query, key, value)
    return query.new_empty(*query.shape[:-1], value.shape[-1])


@contextlib.contextmanager
def fused_attention():
    """F.scaled_dot_product_attention as a fused kernel's memory (see the module docstring)."""
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def attention_flops(q_shape, k_shape, v_shape) -> int:
    """2 B H L S E (scores) + 2 B H L S Ev (weighted sum)."""
    b, h, length, e = q_shape
    s, ev = k_shape[-2], v_shape[-1]
    return 2 * b * h * length * s * (e + ev)


@dataclass
class Trace:
    """One call: peak activation bytes (forward, and forward + backward when `grad`), forward FLOPs, and the bytes
    the forward leaves held for the backward (its saved activations and output)."""

    forward_peak: int
    peak: int
    forward_flops: int
    held: int


def trace(
    module: nn.Module, inputs: dict, *, grad: bool, fused: bool = True, kernels: Kernels = "cuda"
) -> Trace:
    """Run `module(**inputs)` on meta (with backward of a scalar loss when `grad`); parameters that require grad get
    a gradient first, as from an earlier micro-batch, so only the activations are counted. `fused = False` keeps
    the module's own attention (text encoders run eager attention, which holds the score matrix); `kernels` the
    machine whose kernel workspace counts (see `kernel_workspace`). The FLOPs are
    counted in a second, no-grad forward: the FLOP counter's module hooks would keep activations alive."""
    if grad:
        for p in module.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.empty_like(p)
    patch = fused_attention if fused else contextlib.nullcontext
    mode = LiveBytes(kernels)
    with contextlib.nullcontext() if grad else torch.no_grad(), patch(), mode:
        out = module(**inputs)
        out = out[0] if isinstance(out, tuple) else out
        forward_peak, held = mode.peak, mode.live
        if grad:
            out.float().square().mean().backward()
        del out
    counter, attention = FlopCounterMode(display=False), _AttentionFlops()
    with torch.no_grad(), patch(), attention, counter:
        module(**inputs)
    return Trace(forward_peak, mode.peak, counter.get_total_flops() + attention.forward_flops, held)


class _AttentionFlops:
    """Counts the forward FLOPs of the fused attention stand-in (the FLOP counter never sees inside it)."""

    def __init__(self) -> None:
        self.forward_flops = 0

    def __enter__(self):
        inner = torch.nn.functional.scaled_dot_product_attention

        def counted(query, key, value, *args, **kwargs):
            self.forward_flops += attention_flops(query.shape, key.shape, value.shape)
            return inner(query, key, value, *args, **kwargs)

        self._inner = inner
        torch.nn.functional.scaled_dot_product_attention = counted
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self._inner
