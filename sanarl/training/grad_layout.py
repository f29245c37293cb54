"""Gradients in their parameters' strides under DDP.

DDP copies each gradient into a bucket view laid out with its parameter's strides and warns ("Grad strides do not
match bucket view strides ... may impair performance") when the strides differ, even when they differ only on
dimensions of size 1, where any stride addresses the same memory. Convolution backward hands such gradients to
the weights of SANA's feed-forward convolutions (the depthwise `[C, 1, 3, 3]` and 1x1 weights, whose inputs are
channels-last views of the token grid): the same values at the same addresses as the parameter's layout, only the
size-1 strides differ, and autograd keeps them (its layout rule ignores size-1 dimensions). A hook on each such
parameter re-views the incoming gradient with the parameter's strides: no copy, the same values, and DDP finds
the layout it expects.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch


def same_memory(shape: torch.Size, strides: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """Whether two stride tuples of `shape` address the same elements: equal on every dimension of size > 1."""
    return all(a == b for size, a, b in zip(shape, strides, other, strict=True) if size > 1)


def _in_strides(strides: tuple[int, ...], grad: torch.Tensor) -> torch.Tensor | None:
    """`grad` viewed with `strides` when only its size-1 strides differ; None (keep it) otherwise."""
    if grad.stride() == strides or not same_memory(grad.shape, grad.stride(), strides):
        return None
    return grad.as_strided(grad.shape, strides, grad.storage_offset())


def match_bucket_strides(wrapped: torch.nn.Module) -> int:
    """Under DDP (`wrapped` is a DistributedDataParallel), `keep_parameter_strides` on its trainable parameters;
    returns how many were hooked (0 without DDP)."""
    if not isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        return 0
    return keep_parameter_strides(p for p in wrapped.module.parameters() if p.requires_grad)


def keep_parameter_strides(params: Iterable[torch.Tensor]) -> int:
    """Hook every parameter with a size-1 dimension (and more than one dimension) so that a gradient differing
    from it only in size-1 strides arrives viewed with the parameter's strides; returns how many were hooked."""
    hooked = 0
    for param in params:
        if param.ndim > 1 and 1 in param.shape:
            param.register_hook(functools.partial(_in_strides, param.stride()))
            hooked += 1
    return hooked
