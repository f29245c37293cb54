"""torch.compile on CPU (inductor builds C++ kernels) for a one-block SANA transformer: the compiled inference copy
(`rollout.compile_mode`) and the runner's `train.compile` forward give the eager numbers. One block keeps the
compile to tens of seconds; the full tiny models take minutes on 2 cores (docs/multi-gpu.md)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_block():
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    model = SanaTransformer2DModel(
        in_channels=3, out_channels=3, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=8,
        sample_size=8, patch_size=2,
    )  # fmt: skip
    inputs = {
        "hidden_states": torch.randn(2, 3, 8, 8),
        "encoder_hidden_states": torch.randn(2, 4, 8),
        "encoder_attention_mask": torch.ones(2, 4),
        "timestep": torch.tensor([300.0, 700.0]),
        "return_dict": False,
    }
    return model.eval(), inputs


def test_compiled_inference_copy_equals_eager(one_block):
    from sanarl.methods.group_rl.inference_copy import InferenceCopy

    model, inputs = one_block
    copy = InferenceCopy(model, compile_mode="default")
    assert copy.forward_module is not copy.module  # the compiled wrapper
    with torch.no_grad():
        eager = model(**inputs)[0]
        compiled = copy.forward_module(**inputs)[0]
    assert compiled.abs().max() > 0.1
    assert torch.allclose(compiled, eager, atol=1e-5), float((compiled - eager).abs().max())


def test_train_compile_forward_and_backward_equal_eager(one_block):
    """What `train.compile = true` does to the trained forward (runner `_compiled`): the same loss and gradients."""
    model, inputs = one_block
    model.train()
    target = torch.randn(2, 3, 8, 8)

    def loss_and_grads(forward):
        model.zero_grad()
        loss = (forward(**inputs)[0] - target).pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager_loss, eager_grads = loss_and_grads(model)
    compiled_loss, compiled_grads = loss_and_grads(torch.compile(model))
    assert torch.allclose(compiled_loss, eager_loss, rtol=1e-5)
    worst = max(float((a - b).abs().max()) for a, b in zip(compiled_grads, eager_grads, strict=True))
    assert worst < 1e-5, worst
