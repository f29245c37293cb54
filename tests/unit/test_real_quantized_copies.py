"""The quantized rollout copies at the real models' shapes (meta device, no weights): which layers each preset's copy
quantizes and what share of the weights, the 1x1 convolutions of SANA's GLU feed-forward among them, and the layer
arithmetic for a 1x1 convolution against the convolution itself.

SANA's rule is Sol-RL's on its native model, translated to diffusers' names: skip the self-attention q / k / v
(`attn.qkv`), keep layers whose largest side is <= 2240 in bf16, and measure the cross-attention `kv_linear`
(2240 -> 4480), split by diffusers into `attn2.to_k` and `attn2.to_v`, at its fused width; the feed-forward's
1x1 convolutions (2240 -> 11200, 5600 -> 2240) are linear layers over channels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from sanarl.methods.group_rl.quantize import Fp8Linear, Int8DynamicLinear, eligible_linears, quantization_plan

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from real_archs import build, count_params, layers_by_suffix  # noqa: E402

SANA_16 = "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers"
SANA_48 = "Efficient-Large-Model/SANA1.5_4.8B_1024px_diffusers"
SANA_VIDEO = "Efficient-Large-Model/SANA-Video_2B_480p_diffusers"
SANA_QUANTIZED = {"attn2.to_k", "attn2.to_v", "ff.conv_inverted", "ff.conv_point"}


def _sana_block_weights(width: int, ff_hidden: int) -> int:
    """Weights of the quantized layers of one SANA block: cross-attention k and v (width x width each), the GLU
    feed-forward's 1x1 convolutions width -> 2 ff_hidden and ff_hidden -> width."""
    return 2 * width * width + width * 2 * ff_hidden + ff_hidden * width


@pytest.mark.parametrize(
    ("name", "blocks", "ff_hidden"),
    [(SANA_16, 20, 5600), (SANA_48, 60, 5600), (SANA_VIDEO, 20, 6720)],
    ids=["sana-1.6b", "sana-4.8b", "sana-video-2b"],
)
def test_sana_copy_quantizes_cross_attention_kv_and_the_feed_forward_convolutions(name, blocks, ff_hidden):
    """At min dim 2240 (Sol-RL's SANA value) the copy replaces 4 layers per block, 54-61% of the weights
    (before: 0 layers, every diffusers SANA projection is 2240 x 2240 and the feed-forward is Conv2d)."""
    model = build(name)
    names = eligible_linears(model, 2240)
    assert layers_by_suffix(names) == dict.fromkeys(SANA_QUANTIZED, blocks)
    assert all(type(model.get_submodule(n)).__name__ in ("Linear", "Conv2d") for n in names)
    plan = quantization_plan(model, 2240)
    expected = blocks * _sana_block_weights(2240, ff_hidden)
    assert plan.quantized_params == expected
    assert plan.total_params == count_params(model)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    convs_1x1 = sum(
        isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) and m.groups == 1 for m in model.modules()
    )
    assert plan.candidates == linears + convs_1x1
    assert 0.5 < plan.share < 0.65


def test_sana_16b_numbers_validate_prints():
    plan = quantization_plan(build(SANA_16), 2240)
    assert (len(plan.names), plan.candidates) == (80, 207)
    assert round(100 * plan.share, 1) == 59.4
    assert "80 of 207 linear layers" in plan.summary() and "59.4% of the weights" in plan.summary()


def test_a_lower_min_dim_also_quantizes_the_square_projections_but_never_self_attention_qkv():
    names = eligible_linears(build(SANA_16), 2048)
    assert layers_by_suffix(names) == {
        k: 20
        for k in (
            "attn1.to_out.0",
            "attn2.to_q",
            "attn2.to_k",
            "attn2.to_v",
            "attn2.to_out.0",
            "ff.conv_inverted",
            "ff.conv_point",
        )
    }  # embedders, time embedding and output stay on the skip list
    assert not any(n.endswith(("attn1.to_q", "attn1.to_k", "attn1.to_v", "conv_depth")) for n in names)


@pytest.mark.parametrize("layer_cls", [Int8DynamicLinear, Fp8Linear], ids=["int8", "fp8"])
def test_quantized_1x1_convolution_is_the_quantized_linear_over_channels(layer_cls):
    """A 1x1 Conv2d replaced by a quantized layer equals the same quantized layer built from the equivalent
    nn.Linear, applied to the channels-last input, and stays close to the convolution."""
    torch.manual_seed(0)
    conv = nn.Conv2d(64, 48, kernel_size=1)
    linear = nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(conv.weight[:, :, 0, 0])
        linear.bias.copy_(conv.bias)
    x = torch.randn(2, 64, 5, 3)
    q_conv, q_linear = layer_cls(conv), layer_cls(linear)
    with torch.no_grad():
        out, exact = q_conv(x), conv(x)
        by_hand = q_linear(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    assert out.shape == exact.shape
    torch.testing.assert_close(out, by_hand, atol=0, rtol=0)
    rel = ((out - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 0.1


def test_quantized_copy_of_a_tiny_sana_runs_with_its_convolutions_replaced():
    """The int8 copy of a tiny SANA (every layer eligible at min dim 0) replaces the feed-forward convolutions too
    and tracks the float copy."""
    import copy

    from sanarl.methods.group_rl.quantize import quantize_linears
    from sanarl.models.tiny import sana_transformer

    torch.manual_seed(0)
    model = sana_transformer(channels=16, heads=2, head_dim=16, layers=2, caption=32, patch=1).eval()
    quantized = copy.deepcopy(model)
    names = quantize_linears(quantized, "int8", min_dim=0)
    assert any(n.endswith("ff.conv_inverted") for n in names) and any(
        n.endswith("ff.conv_point") for n in names
    )
    x = torch.randn(2, 16, 8, 8)
    text = torch.randn(2, 5, model.config.caption_channels)
    kwargs = {"encoder_hidden_states": text, "timestep": torch.tensor([300.0, 800.0]), "return_dict": False}
    with torch.no_grad():
        out, exact = quantized(x, **kwargs)[0], model(x, **kwargs)[0]
    rel = ((out - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 0.05, rel


def _validate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "sanarl", "validate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_validate_prints_what_the_sana_sol_rl_copy_quantizes_without_weights(tmp_path):
    """From an unrelated directory, with no weights anywhere (offline, an empty cache): the plan row comes from the
    architecture on the meta device."""
    result = _validate("--config", "sana-image-nft-sol_rl", "sanarl.datasets.diffusion_nft", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    flat = " ".join(result.stdout.split())
    assert "quantized copy" in flat
    assert "80 of 207 linear layers (1x1 convolutions included), 59.4% of the weights" in flat
    assert "are not available locally" in flat  # validate read no weights: there are none here


@pytest.mark.slow
def test_validate_refuses_a_quantized_copy_that_would_quantize_nothing(tmp_path):
    result = _validate("--config", "tiny-shapes-nft-solrl", "sanarl.datasets.shapes", "--set",
                       "rollout.preview_precision=int8", "--set", "rollout.nvfp4_min_dim=100000",
                       cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    flat = " ".join(result.stderr.split())
    assert "would quantize no layer" in flat and "rollout.nvfp4_min_dim = 100000" in flat
    assert "Lower `rollout.nvfp4_min_dim`" in flat and 'preview_precision = "bf16"' in flat
    assert "valid" not in result.stdout


def test_a_run_refuses_a_copy_that_would_quantize_nothing():
    """The run's own check (at the copy's construction, before any rollout): exit 2 with the fix, as validate."""
    from sanarl.errors import UserError
    from sanarl.methods.group_rl.quantize import quantize_linears
    from sanarl.models.tiny import sana_transformer

    model = sana_transformer(channels=16, heads=2, head_dim=16, layers=1, caption=32, patch=1)
    with pytest.raises(UserError, match=r"would quantize no layer.*nvfp4_min_dim = 4096.*largest side"):
        quantize_linears(model, "int8", min_dim=4096)
