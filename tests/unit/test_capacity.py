"""The memory plan's measuring instruments (sanarl/tools/capacity): the meta-device trace against a measured CPU
peak and a hand count of FLOPs, and the depth extrapolation against a full trace of the real SANA 1.6B."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from sanarl.tools.capacity.simulate import onednn_runs, trace

SMALL_SANA = dict(in_channels=8, out_channels=8, num_attention_heads=8, attention_head_dim=32, num_layers=4,
                  num_cross_attention_heads=4, cross_attention_head_dim=64, cross_attention_dim=256,
                  caption_channels=128, sample_size=16, patch_size=1, qk_norm="rms_norm_across_heads")  # fmt: skip

MEASURE = r"""
import json, sys, torch
from diffusers import SanaTransformer2DModel
from sanarl.core.lora import add_lora_adapters
config, checkpointing = json.loads(sys.argv[1]), sys.argv[2] == "1"
torch.manual_seed(0)
model = SanaTransformer2DModel(**config).requires_grad_(False)
add_lora_adapters(model, ["default", "old"], r=8, alpha=8, init="gaussian",
                  target_modules=["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q"])
if checkpointing:
    model.enable_gradient_checkpointing()
for p in model.parameters():
    if p.requires_grad:
        p.grad = torch.zeros_like(p)
def inputs(b):
    return dict(hidden_states=torch.randn(b, 8, 32, 32), encoder_hidden_states=torch.randn(b, 64, 128),
                encoder_attention_mask=torch.ones(b, 64), timestep=torch.ones(b), return_dict=False)
model(**inputs(1))[0].square().mean().backward()  # warm-up: kernels and allocator arenas
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
batch = inputs(4)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
out = model(**batch)[0]
out.float().square().mean().backward()
del out
print(json.dumps(status("VmHWM") - base))
"""


def _meta_sana(checkpointing: bool):
    from diffusers import SanaTransformer2DModel

    from sanarl.core.lora import add_lora_adapters

    with torch.device("meta"):
        model = SanaTransformer2DModel(**SMALL_SANA).requires_grad_(False)
        add_lora_adapters(model, ["default", "old"], r=8, alpha=8, init="gaussian",
                          target_modules=["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q"])  # fmt: skip
    if checkpointing:
        model.enable_gradient_checkpointing()
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    inputs = dict(hidden_states=meta(4, 8, 32, 32), encoder_hidden_states=meta(4, 64, 128),
                  encoder_attention_mask=meta(4, 64), timestep=meta(4), return_dict=False)  # fmt: skip
    return model, inputs


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc (peak-RSS reset)")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_meta_trace_peak_matches_measured_cpu_peak(checkpointing):
    """The activation peak of a LoRA SANA forward + backward, traced on meta, equals the measured peak RSS of the same
    call on the CPU (glibc's mmap threshold pinned so freed tensors leave the resident set) within 3%."""
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(SMALL_SANA), str(int(checkpointing))],
                          env=env, capture_output=True, text=True, check=True)  # fmt: skip
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    model, inputs = _meta_sana(checkpointing)
    simulated = trace(model, inputs, grad=True).peak
    assert simulated == pytest.approx(measured, rel=0.03), (simulated, measured)


CONV = r"""
import json, torch
torch.set_default_dtype(torch.bfloat16)
conv = torch.nn.Conv2d(2240, 11200, 1).requires_grad_(False)  # SANA 1.6B's widest convolution
def step():
    x = torch.randn(1, 2240, 8, 8, requires_grad=True)
    conv(x).float().square().mean().backward()
step()  # warm-up: kernels and allocator arenas
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
step()
print(json.dumps(status("VmHWM") - base))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc (peak-RSS reset)")
def test_cpu_kernels_count_the_reordered_bfloat16_convolution_weight():
    """A bfloat16 1x1 convolution with a 48 MiB weight on a small input: where oneDNN runs bfloat16 convolutions,
    its measured CPU peak is about the weight (oneDNN's reordered copy) on top of the activations; the CPU trace
    matches it within 5%, and the GPU trace, which has no such workspace, is far below it. On a CPU whose oneDNN
    does not run bfloat16 (AVX2 only) the process holds no copy of the weight, and the CPU trace counts none."""
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run([sys.executable, "-c", CONV], env=env, capture_output=True, text=True, check=True)
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    with torch.device("meta"):
        conv = nn.Conv2d(2240, 11200, 1, dtype=torch.bfloat16).requires_grad_(False)
        x = torch.empty(1, 2240, 8, 8, dtype=torch.bfloat16, requires_grad=True)
    weight = conv.weight.numel() * 2

    class Call(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(x)

    cpu = trace(Call(), {"x": x}, grad=True, kernels="cpu").peak
    gpu = trace(Call(), {"x": x}, grad=True, kernels="cuda").peak
    if not onednn_runs(torch.bfloat16):  # e.g. AVX2 only: ATen's kernels run it, with no copy of the weight
        assert cpu == gpu and measured < 0.5 * weight, (cpu, gpu, measured)
        return
    assert cpu == pytest.approx(measured, rel=0.05), (cpu, measured)
    assert cpu - gpu > 0.7 * weight  # the copy lands where the GPU trace's peak is not
    assert gpu < 0.5 * measured


def test_flop_count_matches_a_hand_count():
    """FLOPs of a stack of MLP layers and attention: 2 x rows x in x out per linear layer, 2 B H L S (E + Ev) per
    attention (the fused-kernel stand-in), derived here from the shapes."""
    b, length, d, heads = 3, 40, 64, 4

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            q, k, v = self.qkv(x).view(b, length, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, length, d)
            x = x + self.out(a)
            return x + self.down(nn.functional.gelu(self.up(x)))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, hidden_states):
            for block in self.blocks:
                hidden_states = block(hidden_states)
            return hidden_states

    with torch.device("meta"):
        stack = Stack()
    rows = b * length
    linear = 2 * rows * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)
    attention = 2 * b * heads * length * length * (2 * (d // heads))
    hand = 3 * (linear + attention)
    counted = trace(
        stack, {"hidden_states": torch.empty(b, length, d, device="meta")}, grad=False
    ).forward_flops
    assert counted == hand


@pytest.mark.slow
@pytest.mark.parametrize(
    ("grad", "checkpointing", "kernels"),
    [(True, True, "cuda"), (True, False, "cuda"), (False, False, "cuda"), (True, True, "cpu")],
)
def test_depth_extrapolation_equals_the_full_trace_of_sana_1_6b(grad, checkpointing, kernels):
    """`traced` (three shallow traces extrapolated in depth) gives the full 20-block SANA 1.5 1.6B trace's peak and
    FLOPs within 1%, with the CPU's convolution workspace counted too."""
    from sanarl.config.presets import resolve_preset_path
    from sanarl.methods.config_loading import load_config
    from sanarl.models.meta import architecture
    from sanarl.tools.capacity.memory import _trace_once, traced

    overrides = ["policy.diffusers.inference_size=[512,512]"]
    cfg = load_config(resolve_preset_path("sana-image-nft-sol_rl"), overrides).config
    arch = architecture(cfg.policy.model_name_or_path)
    shallow = traced(cfg, 2, grad=grad, checkpointing=checkpointing, kernels=kernels)
    full = _trace_once(cfg, arch, 2, grad, checkpointing, True, kernels)
    assert shallow.peak == pytest.approx(full.peak, rel=0.01)
    assert shallow.forward_flops == pytest.approx(full.forward_flops, rel=0.01)
