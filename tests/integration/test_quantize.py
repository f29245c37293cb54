"""Quantized rollout copies on CPU: the int8 backend (sanarl/methods/group_rl/quantize.py) against its formula, the int8 copy of
a tiny FLUX against the float32 copy, the Sol-RL selection it drives on a fixed draft set, and which backend each
`rollout.preview_precision` gets on which machine.

Tolerance of the int8 copy (stated): the velocity's relative L2 error against the float32 copy is below 5% (and
above 1e-4: the error is real), here about 1%. The selection test keeps K = 4 of M = 12 drafts by best / worst of a
reward, ranked once on the float32 copy's drafts and once on the int8 copy's."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from sanarl import api
from sanarl.core.selection import select_indices
from sanarl.errors import UserError
from sanarl.methods.config_loading import load_config
from sanarl.methods.group_rl import quantize
from sanarl.methods.group_rl.quantize import Int8DynamicLinear, backend_for
from sanarl.methods.group_rl.rollout import group_seeds

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "sd3-nft.toml"
TOLERANCE = 0.05


def _hand_int8(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The dynamic int8 linear from its definition: W per output channel to int8 (scale max|row| / 127, zero 0),
    x per tensor to uint8 over [min(x, 0), max(x, 0)] (scale range / 255, zero point round(-min / scale))."""
    w_scale = w.abs().amax(dim=1) / 127
    q_w = torch.round(w / w_scale[:, None]).clamp(-127, 127)
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    x_scale = (hi - lo) / 255
    zero = round(-lo / x_scale)
    q_x = torch.clamp(torch.round(x / x_scale) + zero, 0, 255)
    return ((q_x - zero) * x_scale) @ (q_w * w_scale[:, None]).t() + b


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "emulated"])
def test_int8_linear_is_its_formula_with_a_real_error(monkeypatch, kernel):
    if not kernel:
        monkeypatch.setattr(quantize, "_kernel_available", lambda: False)
    torch.manual_seed(0)
    layer = nn.Linear(128, 64)
    x = torch.randn(3, 5, 128) * 2 + 0.3
    q = Int8DynamicLinear(layer)
    with torch.no_grad():
        out, exact = q(x), layer(x)
    hand = _hand_int8(x.reshape(-1, 128), layer.weight, layer.bias).reshape(3, 5, 64)
    torch.testing.assert_close(out, hand, atol=1e-4, rtol=1e-5)
    rel = ((out - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 0.02
    # a refresh of the master weight (in place, as InferenceCopy.refresh) re-quantizes on the next call
    with torch.no_grad():
        q.weight.mul_(-1.0)
        torch.testing.assert_close(q(x), _hand_int8(x.reshape(-1, 128), -layer.weight, layer.bias).reshape(3, 5, 64),
                                   atol=1e-4, rtol=1e-5)  # fmt: skip


def test_the_int8_kernel_serves_only_where_it_computes_the_formula():
    """`_kernel_available` says yes exactly when torch's dynamic int8 kernel reproduces the hand formula on this
    machine (checked here on other data than its probe); elsewhere the emulated arithmetic serves."""
    quantize._kernel_available.cache_clear()
    torch.manual_seed(1)
    layer = nn.Linear(96, 40)
    x = torch.randn(7, 96) * 1.5 - 0.2
    w_scale = (layer.weight.detach().abs().amax(dim=1) / 127).double()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(
                layer.weight.detach(), w_scale, torch.zeros(40).long(), 0, torch.qint8
            )
            packed = torch.ops.quantized.linear_prepack(q, layer.bias.detach())
            out = torch.ops.quantized.linear_dynamic(x, packed, False)
        agrees = torch.allclose(
            out, _hand_int8(x, layer.weight.detach(), layer.bias.detach()), rtol=1e-4, atol=1e-4
        )
    except RuntimeError:
        agrees = False
    assert quantize._kernel_available() == agrees
    assert (Int8DynamicLinear(layer).packed()[0] == "kernel") == agrees


def test_fp8_linear_is_its_formula():
    """The torch-native FP8 layer (the sm_89+ backend without transformer-engine) from its definition: W and x cast
    to float8 e4m3 after dividing by per-tensor scales max|.| / 448, multiplied, rescaled, bf16 output. torch's
    `_scaled_mm` also runs on CPU, which checks the arithmetic here; the GPU is where the backend is chosen."""
    from sanarl.methods.group_rl.quantize import Fp8Linear

    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        out, exact = Fp8Linear(layer)(x), layer(x)
        w_scale, x_scale = layer.weight.abs().max() / 448, x.abs().max() / 448
        q_w = (layer.weight / w_scale).to(torch.float8_e4m3fn).float() * w_scale
        q_x = (x / x_scale).to(torch.float8_e4m3fn).float() * x_scale
        hand = (q_x @ q_w.t() + layer.bias.to(torch.bfloat16).float()).to(torch.bfloat16).float()
    torch.testing.assert_close(out, hand, atol=1e-2, rtol=0)  # one bf16 rounding at |y| ~ 1.5 apart at most
    rel = ((out - exact).norm() / exact.norm()).item()
    assert 1e-3 < rel < 0.1


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    """sol_rl rollouts on the tiny FLUX with an int8 preview copy (every linear eligible: min dim 0)."""
    out = tmp_path_factory.mktemp("quant")
    overrides = [
        f"train.output_dir={out}",
        "policy.model_name_or_path=sanarl-tiny:flux",
        "policy.lora.target_modules=[]",
        "rollout.family=sol_rl",
        "rollout.num_candidates=12",
        "rollout.preview_step=4",
        "rollout.preview_precision=int8",
        "rollout.nvfp4_min_dim=0",
        "rollout.reward_workers=0",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.train(load_config(PRESET, overrides), "sanarl.datasets.shapes", dry_run=True).task.rollouts


def _velocity(rollouts, module, seed: int = 0) -> torch.Tensor:
    adapter = rollouts.adapter
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, *adapter.latent_shape(32, 32), generator=gen)
    cond = adapter.encode_prompts(["a red circle", "two blue squares"])
    with torch.no_grad():
        return adapter.velocity(x, torch.tensor([0.3, 0.8]), cond, module)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_int8_copy_tracks_the_float32_copy(rollouts):
    preview, full = rollouts.preview_copy.module, rollouts.full_copy.module
    quantized = [n for n, m in preview.named_modules() if isinstance(m, Int8DynamicLinear)]
    assert (
        "transformer_blocks.0.attn.to_q" in quantized and "single_transformer_blocks.0.proj_mlp" in quantized
    )
    assert not any(
        part in n for n in quantized for part in ("x_embedder", "context_embedder", "time_text_embed")
    )
    assert not any(isinstance(m, Int8DynamicLinear) for m in full.modules())
    rel = _rel(_velocity(rollouts, preview), _velocity(rollouts, full))
    assert 1e-4 < rel < TOLERANCE, rel


def test_selection_on_the_int8_preview_keeps_the_float32_seeds(rollouts):
    """A fixed draft set (12 seeds of one prompt); the reward is each image's mean red minus mean blue. The K = 4 kept by
    best / worst on the int8 preview's drafts are the float32 preview's."""
    adapter = rollouts.adapter
    seeds = group_seeds(3, 0, 0, 0, 12)
    cond = adapter.encode_prompts(["a red circle"])
    kept = {}
    for name, copy_ in (("int8", rollouts.preview_copy), ("float32", rollouts.full_copy)):
        images = adapter.decode(rollouts._sample(cond, seeds, rollouts.preview_spec, copy_))
        reward = images[:, 0].mean(dim=(1, 2)) - images[:, 2].mean(dim=(1, 2))
        kept[name] = sorted(seeds[i] for i in select_indices(reward, 4, "best_worst").tolist())
    assert kept["int8"] == kept["float32"]


def test_int8_copy_follows_a_refresh(rollouts):
    live = rollouts.adapter.trainable_module()
    before = _velocity(rollouts, rollouts.preview_copy.module)
    with torch.no_grad():
        for name, p in live.named_parameters():
            if ".old." in name and "lora_B" in name:
                p.normal_(0.0, 0.5)
    rollouts.refresh()
    after_q, after_full = (
        _velocity(rollouts, rollouts.preview_copy.module),
        _velocity(rollouts, rollouts.full_copy.module),
    )
    assert _rel(after_q, before) > 2 * TOLERANCE  # the old adapter really moved the copy
    assert _rel(after_q, after_full) < TOLERANCE


# --- which backend on which machine -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("capability", "te", "precision", "expected"),
    [
        (None, False, "int8", ("int8", "int8")),
        (None, False, "auto", ("int8", "int8")),
        (None, False, "bf16", None),
        ((9, 0), False, "fp8", ("fp8", "torch_fp8")),
        ((9, 0), True, "fp8", ("fp8", "te")),
        ((9, 0), False, "auto", ("fp8", "torch_fp8")),
        ((10, 0), True, "auto", ("nvfp4", "te")),
        ((10, 0), False, "auto", ("fp8", "torch_fp8")),
        ((8, 0), False, "auto", None),
        ((9, 0), True, "e2m1_delayed", ("e2m1_delayed", "te")),
        ((10, 0), True, "e2m1_delayed", ("e2m1_delayed", "te")),
    ],
)
def test_backend_follows_precision_and_machine(monkeypatch, capability, te, precision, expected):
    monkeypatch.setattr(quantize, "_capability", lambda: capability)
    monkeypatch.setattr(quantize, "_has_te", lambda: te)
    assert backend_for(precision) == expected


@pytest.mark.parametrize(
    ("capability", "te", "precision", "needle"),
    [
        (None, False, "fp8", 'preview_precision = "auto"'),
        (None, False, "nvfp4", "Blackwell"),
        ((9, 0), False, "nvfp4", "Blackwell"),
        ((10, 0), False, "nvfp4", "transformer-engine"),
        (None, False, "e2m1_delayed", "sm_89"),
        ((9, 0), False, "e2m1_delayed", "transformer-engine"),
        ((8, 6), True, "e2m1_delayed", "sm_89"),
    ],
)
def test_precisions_the_machine_cannot_run_name_the_fix(monkeypatch, capability, te, precision, needle):
    monkeypatch.setattr(quantize, "_capability", lambda: capability)
    monkeypatch.setattr(quantize, "_has_te", lambda: te)
    with pytest.raises(UserError, match=needle):
        quantize.check_quantization(precision, "sol_rl")


def test_real_architectures_quantize_what_sol_rl_quantizes():
    """The skip lists and min dims of Sol-RL's presets on the real FLUX.1-dev and SD3.5-Large shapes (meta device, no
    memory): Sol-RL's rule keeps a layer whose largest side is <= min dim, so SD3.5-L's 2432 x 2432 attention
    projections stay bf16 and only its image feed-forwards are quantized, while FLUX.1-dev quantizes all but its
    embedders and output norm."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    from sanarl.methods.group_rl.quantize import eligible_linears

    with torch.device("meta"):
        flux = FluxTransformer2DModel(guidance_embeds=True)  # the defaults are FLUX.1's shapes
        large = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16, num_layers=38,
                                      attention_head_dim=64, num_attention_heads=38, joint_attention_dim=4096,
                                      caption_projection_dim=2432, pooled_projection_dim=2048, out_channels=16,
                                      pos_embed_max_size=192, qk_norm="rms_norm", dual_attention_layers=())  # fmt: skip
    linears = {n for n, m in flux.named_modules() if isinstance(m, nn.Linear)}
    kept = linears - set(eligible_linears(flux, 1000))
    assert {n.split(".")[0] for n in kept} == {
        "x_embedder",
        "context_embedder",
        "time_text_embed",
        "norm_out",
    }
    assert len(linears) - len(kept) == 495
    quantized = eligible_linears(large, 2432)
    assert len(quantized) == 2 * 38
    assert all(n.endswith((".ff.net.0.proj", ".ff.net.2")) and ".ff_context." not in n for n in quantized)


def _fake_transformer_engine(monkeypatch) -> list:
    """transformer-engine's recipe module as its source defines the parts used here (a Format enum with E2M1, E4M3,
    HYBRID; recipe classes taking keyword arguments), recording every construction."""
    import enum
    import importlib.machinery
    import types

    built: list = []

    class Format(enum.Enum):
        E2M1 = "E2M1"
        E4M3 = "E4M3"
        HYBRID = "HYBRID"

    def recipe_class(name):
        return type(name, (), {"__init__": lambda self, **kwargs: built.append((name, kwargs))})

    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Format = Format
    for name in ("DelayedScaling", "NVFP4BlockScaling"):
        setattr(recipe, name, recipe_class(name))
    common = types.ModuleType("transformer_engine.common")
    common.recipe = recipe
    package = types.ModuleType("transformer_engine")
    package.common = common
    for name, module in (("transformer_engine", package), ("transformer_engine.common", common),
                         ("transformer_engine.common.recipe", recipe)):  # fmt: skip
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    return built, Format


def test_sol_rl_presets_use_sol_rls_recipe_as_written(monkeypatch):
    """Sol-RL's preview copies run under transformer-engine's DelayedScaling(fp8_format=Format.E2M1,
    amax_history_len=16, amax_compute_algo="max") (its NVFP4_RECIPE); `e2m1_delayed` builds exactly that, `nvfp4`
    NVFP4BlockScaling() and `fp8` DelayedScaling() with transformer-engine's defaults."""
    built, Format = _fake_transformer_engine(monkeypatch)
    for precision in ("e2m1_delayed", "nvfp4", "fp8"):
        quantize.te_recipe(precision)
    assert built == [
        ("DelayedScaling", {"fp8_format": Format.E2M1, "amax_history_len": 16, "amax_compute_algo": "max"}),
        ("NVFP4BlockScaling", {}),
        ("DelayedScaling", {}),
    ]
    for preset in ("sana-image", "flux1", "sd35l"):
        for family in ("naive_quant", "sol_rl"):
            cfg = load_config(ROOT / "sanarl" / "presets" / f"{preset}-nft-{family}.toml").config
            assert cfg.rollout.preview_precision == "e2m1_delayed", (preset, family)


def test_sol_rls_recipe_needs_transformer_engine(monkeypatch):
    """Without transformer-engine the recipe cannot be built: the run stops at start (exit 2) naming the package."""
    monkeypatch.setattr(quantize, "_capability", lambda: (9, 0))
    monkeypatch.setattr(quantize, "_has_te", lambda: False)
    with pytest.raises(UserError, match=r"sanarl\[te\]"):
        quantize.check_quantization("e2m1_delayed", "sol_rl")


def test_the_transformer_engine_path_wires_linears_convolutions_and_the_recipe(monkeypatch):
    """The transformer-engine backend on CPU with a stand-in for `te.Linear` (an exact nn.Linear taking TE's
    constructor arguments) and `te.fp8_autocast` (recording its recipe): every eligible layer of a tiny SANA, the
    feed-forward's 1x1 convolutions included, becomes a TE layer holding the same weights, the forward runs under
    Sol-RL's recipe, and the copy computes what the float model computes."""
    import contextlib
    import copy
    import importlib.machinery
    import types

    from sanarl.models.tiny import sana_transformer

    torch.manual_seed(0)
    model = sana_transformer(channels=16, heads=2, head_dim=16, layers=1, caption=32, patch=1).eval()
    built, Format = _fake_transformer_engine(monkeypatch)
    autocasts = []

    class Linear(nn.Linear):
        def __init__(self, n_in, n_out, bias=True, params_dtype=None, device=None):
            super().__init__(n_in, n_out, bias=bias, device=device)

    @contextlib.contextmanager
    def fp8_autocast(enabled, fp8_recipe):
        autocasts.append((enabled, fp8_recipe))
        yield

    te = types.ModuleType("transformer_engine.pytorch")
    te.Linear, te.fp8_autocast = Linear, fp8_autocast
    te.__spec__ = importlib.machinery.ModuleSpec("transformer_engine.pytorch", None)
    sys.modules["transformer_engine"].pytorch = te
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    monkeypatch.setattr(quantize, "_capability", lambda: (9, 0))
    monkeypatch.setattr(quantize, "_has_te", lambda: True)

    copy_ = copy.deepcopy(model)
    names = quantize.quantize_linears(copy_, "e2m1_delayed", min_dim=0)
    assert names == quantize.eligible_linears(model, 0)
    conv = copy_.get_submodule("transformer_blocks.0.ff.conv_inverted")
    original = model.get_submodule("transformer_blocks.0.ff.conv_inverted").weight
    assert isinstance(conv.inner, Linear) and torch.equal(conv.weight, original[:, :, 0, 0])
    assert isinstance(copy_.get_submodule("transformer_blocks.0.attn2.to_k"), Linear)
    x, text = torch.randn(2, 16, 8, 8), torch.randn(2, 5, 32)
    kwargs = {"encoder_hidden_states": text, "timestep": torch.tensor([300.0, 800.0]), "return_dict": False}
    with torch.no_grad():
        torch.testing.assert_close(copy_(x, **kwargs)[0], model(x, **kwargs)[0], atol=1e-5, rtol=1e-5)
    assert len(autocasts) == 1 and autocasts[0][0] is True
    assert built == [
        ("DelayedScaling", {"fp8_format": Format.E2M1, "amax_history_len": 16, "amax_compute_algo": "max"})
    ]
