"""Gradients in their parameters' strides (sanarl.training.grad_layout): SANA's feed-forward convolutions get
channels-last gradients whose strides differ from the weights' only on size-1 dimensions; the hook re-views them
with the weights' strides (what DDP's bucket views use), same memory, same values, no copy."""

from __future__ import annotations

import copy

import torch

from sanarl.training.grad_layout import keep_parameter_strides, match_bucket_strides, same_memory


def feed_forward() -> torch.nn.Sequential:
    """SANA's GLUMBConv layout: 1x1, depthwise 3x3, 1x1 (float32: its CPU kernels return channels-last weight gradients)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 1), torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.Conv2d(16, 8, 1)
    )


def backward(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients of a forward on a channels-last view of a token grid, as SANA's feed-forward takes it."""
    tokens = torch.randn(2, 5 * 6, 8, generator=torch.Generator().manual_seed(1))
    grid = tokens.unflatten(1, (5, 6)).permute(0, 3, 1, 2)  # [B, C, H, W] view, channels-last strides
    module(grid).square().sum().backward()
    return {name: p.grad for name, p in module.named_parameters()}


def test_a_gradient_differing_only_in_size_one_strides_is_re_viewed() -> None:
    """d/dw sum(w * x) = x: autograd keeps x's strides, which differ from w's only on the size-1 dimension."""
    source = torch.randn(4, 3, 3, 1).permute(0, 3, 1, 2)  # [4, 1, 3, 3], strides (9, 1, 3, 1)
    plain = torch.randn(4, 1, 3, 3, requires_grad=True)  # strides (9, 9, 3, 1)
    hooked = plain.detach().clone().requires_grad_()
    assert keep_parameter_strides([hooked]) == 1
    (plain * source).sum().backward()
    (hooked * source).sum().backward()
    assert plain.grad.stride() != plain.stride()  # what DDP's bucket view would not match
    assert same_memory(plain.shape, plain.grad.stride(), plain.stride())
    assert hooked.grad.stride() == hooked.stride()
    assert torch.equal(hooked.grad, source) and torch.equal(plain.grad, source)


def test_feed_forward_gradients_arrive_in_the_weights_strides_with_the_same_values() -> None:
    plain, hooked = feed_forward(), feed_forward()
    assert keep_parameter_strides(hooked.parameters()) == 3  # the conv weights; biases are 1-D
    expected, got = backward(plain), backward(hooked)
    for name, param in hooked.named_parameters():
        assert got[name].stride() == param.stride(), name
        assert torch.equal(got[name], expected[name]), name


def test_gradients_of_another_memory_layout_are_left_alone() -> None:
    """A weight whose gradient differs on a dimension of size > 1 is not re-viewed (that would read other
    elements): autograd's own layout rule copies it into the parameter's layout."""
    weight = torch.randn(4, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    keep_parameter_strides([weight])
    source = torch.randn(4, 3, 3, 1, dtype=torch.float64).permute(0, 3, 2, 1)  # strides differ on size-3 dims
    (weight * source).sum().backward()
    assert weight.grad.stride() == weight.stride()
    assert torch.equal(weight.grad, source)


def test_only_ddp_is_hooked() -> None:
    module = feed_forward()
    assert match_bucket_strides(module) == 0
    twin = copy.deepcopy(module)
    assert all(
        torch.equal(a, b) for a, b in zip(backward(module).values(), backward(twin).values(), strict=True)
    )
