"""Every shipped real preset at its model's real shapes, on the meta device (no weights, no memory): the shipped
architecture configs, parameter counts against the published sizes, the LoRA layers each preset's targets match,
what each quantized preset's copy quantizes, and the per-rank plans `sanarl validate` prints for the Cosmos-RL and
Sol-RL presets, each re-derived here from the model's shapes or the reference's recipe."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
from torch import nn

from sanarl.methods.config_loading import load_config
from sanarl.models.architecture import shipped_architecture, transformer_config

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "sanarl" / "presets"
sys.path.insert(0, str(ROOT / "tests" / "data"))
from real_archs import CONFIGS, PUBLISHED, build, count_params  # noqa: E402

pytestmark = pytest.mark.slow

REAL = sorted(p.stem for p in PRESETS.glob("*.toml") if not p.stem.startswith("tiny-"))
SHIPPED_MODELS = sorted({load_config(PRESETS / f"{p}.toml").config.policy.model_name_or_path for p in REAL})


def test_every_real_preset_model_ships_its_architecture_as_the_hub_has_it():
    assert set(SHIPPED_MODELS) <= set(CONFIGS)
    for name in SHIPPED_MODELS:
        assert json.loads(shipped_architecture(name).read_text()) == CONFIGS[name], name
        assert transformer_config(name) == CONFIGS[name]  # no local weights here: the shipped copy


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_counts_are_the_published_sizes(name):
    """Parameters plus buffers (SD3's fixed positional table counts in its published size) within 5%."""
    model = build(name)
    total = count_params(model) + sum(b.numel() for b in model.buffers())
    assert abs(total / PUBLISHED[name] - 1) < 0.05, (name, total)


# --- LoRA ---------------------------------------------------------------------------------------------------------
def _expected_lora(name: str, targets: tuple[str, ...], r: int) -> tuple[int, int]:
    """(layers, trainable parameters of one adapter) from the architecture's block structure: SANA 8 square
    attention projections per block; SD3 the 8 joint-attention projections per block, less the last block's
    `to_add_out` (context_pre_only); FLUX q / k / v / out in the double blocks, q / k / v in the single ones."""
    cfg = CONFIGS[name]
    width = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    if cfg["_class_name"].startswith("Sana"):
        assert len(targets) == 8
        layers = 8 * cfg["num_layers"]
    elif cfg["_class_name"] == "SD3Transformer2DModel":
        assert len(targets) == 8
        layers = 8 * cfg["num_layers"] - 1
    else:
        assert set(targets) == {"to_q", "to_k", "to_v", "to_out.0"}
        layers = 4 * cfg["num_layers"] + 3 * cfg["num_single_layers"]
    return layers, layers * r * (width + width)


@functools.cache
def _lora_on_meta(name: str, targets: tuple[str, ...], r: int) -> tuple[int, int]:
    from peft.tuners.lora import LoraLayer

    from sanarl.core.lora import add_lora_adapters

    model = build(name)
    add_lora_adapters(model, ["default"], r=r, alpha=2 * r, init="gaussian", target_modules=list(targets))
    layers = sum(isinstance(m, LoraLayer) for m in model.modules())
    return layers, sum(p.numel() for p in model.parameters() if p.requires_grad)


LORA_PRESETS = [p for p in REAL if load_config(PRESETS / f"{p}.toml").config.policy.lora is not None]


@pytest.mark.parametrize("preset", LORA_PRESETS)
def test_each_presets_lora_targets_match_the_real_layers(preset):
    policy = load_config(PRESETS / f"{preset}.toml").config.policy
    targets = tuple(policy.lora.target_modules)
    assert _lora_on_meta(policy.model_name_or_path, targets, policy.lora.r) == _expected_lora(
        policy.model_name_or_path, targets, policy.lora.r
    )


# --- quantized copies ---------------------------------------------------------------------------------------------
def _sol_rl_rule(model: nn.Module, skip: tuple[str, ...], min_dim: int) -> tuple[int, int]:
    """Sol-RL's replace_linear_with_te on an architecture whose layers it sees as they are: every nn.Linear
    whose name holds no skip pattern and whose largest side is > min_dim. (layers, weights)."""
    chosen = [m for n, m in model.named_modules() if isinstance(m, nn.Linear) and not any(p in n for p in skip)
              and max(m.in_features, m.out_features) > min_dim]  # fmt: skip
    return len(chosen), sum(m.weight.numel() for m in chosen)


QUANTIZED = [f"{m}-nft-{f}" for m in ("sana-image", "flux1", "sd35l") for f in ("naive_quant", "sol_rl")]
SOL_RL_SKIP = {
    "FluxTransformer2DModel": ("x_embedder", "context_embedder", "time_text_embed", "norm_out"),
    "SD3Transformer2DModel": ("pos_embed", "context_embedder", "time_text_embed", "norm_out", "norm1", "ff_context"),
}  # fmt: skip


@pytest.mark.parametrize("preset", QUANTIZED)
def test_each_quantized_preset_quantizes_what_sol_rl_does(preset):
    from sanarl.methods.group_rl.quantize import model_quant_plan

    cfg = load_config(PRESETS / f"{preset}.toml").config
    name, min_dim = cfg.policy.model_name_or_path, cfg.rollout.nvfp4_min_dim
    plan = model_quant_plan(name, None, min_dim, preset)
    model = build(name)
    assert plan.total_params == count_params(model)
    cls = CONFIGS[name]["_class_name"]
    if cls in SOL_RL_SKIP:
        assert (len(plan.names), plan.quantized_params) == _sol_rl_rule(model, SOL_RL_SKIP[cls], min_dim)
    else:  # SANA: Sol-RL's native kv_linear and feed-forward linears are diffusers' attn2.to_k / to_v, 1x1 convs
        blocks, width, hidden = CONFIGS[name]["num_layers"], 2240, 5600
        assert len(plan.names) == 4 * blocks
        assert plan.quantized_params == blocks * (2 * width * width + width * 2 * hidden + hidden * width)
    assert plan.share > 0.2


# --- plans --------------------------------------------------------------------------------------------------------
SOL_RL_BATCH = {"sana-image": 16, "flux1": 12, "sd35l": 4}
SOL_RL_FRACTION = {"sana-image": 0.6, "flux1": 0.4, "sd35l": 0.6}
SOL_RL_PRESETS = [f"{m}-nft{f}" for m in SOL_RL_BATCH for f in ("", "-naive_scaling", "-compile", "-naive_quant",
                                                                 "-sol_rl")]  # fmt: skip
SOL_RL_PRESETS = [p if p != "sana-image-nft" else "sana-image-nft-diffusionnft" for p in SOL_RL_PRESETS]


def _plan_text(run_cli, preset: str) -> str:
    code, out, err = run_cli("validate", "--config", preset, "sanarl.datasets.diffusion_nft")
    assert code == 0, err
    return " ".join(out.replace("│", " ").split())


@pytest.mark.parametrize("preset", SOL_RL_PRESETS)
def test_sol_rl_presets_plan_sol_rls_per_gpu_arithmetic(preset, run_cli, monkeypatch):
    """Sol-RL's _set_bon_combo on 8 GPUs: 48 prompt groups / 8 = 6 prompts per GPU, x 24 kept = 144 samples, in
    144 / train_bsz micro-batches, one optimizer step; int(10 timestep_fraction) trained levels; 96 drafts in every
    family but diffusionnft."""
    monkeypatch.setenv("COLUMNS", "200")
    model = next(m for m in SOL_RL_BATCH if preset.startswith(m))
    bsz, levels = SOL_RL_BATCH[model], int(10 * SOL_RL_FRACTION[model])
    text = _plan_text(run_cli, preset)
    assert "1152 / 24 (n_generation) / 8 rank(s) = 6 prompts x 24 images = 144 samples per rank" in text
    assert f"144 / mini_batch {bsz} = {144 // bsz} per rank, x {levels} trained levels" in text
    drafts = 24 if preset.endswith(("-nft", "-diffusionnft")) else 96
    assert f"{drafts} drafts -> 24 kept per prompt, 10 steps" in text
    if preset.endswith(("naive_quant", "sol_rl")):
        assert "quantized copy" in text and "% of the weights" in text
    if preset.endswith("sol_rl"):
        assert "6 steps at e2m1_delayed" in text


COSMOS_RL = {
    "sana-image-nft": "sana/sana-image-nft.toml",
    "sana-video-nft": "sana/sana-video-nft.toml",
    "sd35m-nft": "stable-diffusion-3-5/stable-diffusion-3-5-medium-nft.toml",
}
"""sanarl preset -> Cosmos-RL's own launch file of the recipe (tests/data/cosmos_rl)."""


@pytest.mark.parametrize("preset", sorted(COSMOS_RL))
def test_cosmos_rl_presets_plan_cosmos_rls_arithmetic(preset, run_cli, monkeypatch):
    """The per-rank arithmetic of Cosmos-RL's launch file (its batch per replica over its dp_shard_size ranks,
    n_generation, mini_batch, int(num_steps timestep_fraction) trained levels) is the sanarl preset's plan."""
    from sanarl.config.engine import tomllib

    monkeypatch.setenv("COLUMNS", "200")
    cosmos = tomllib.loads((ROOT / "tests" / "data" / "cosmos_rl" / COSMOS_RL[preset]).read_text())
    bpr, k = cosmos["train"]["train_batch_per_replica"], cosmos["rollout"]["n_generation"]
    ranks, mb = (
        cosmos["policy"]["parallelism"]["dp_shard_size"],
        cosmos["train"]["train_policy"]["mini_batch"],
    )
    steps = cosmos["policy"]["diffusers"]["sample"]["num_steps"]
    fraction = cosmos["policy"]["diffusers"]["timestep_fraction"]
    per_rank = bpr // ranks
    text = _plan_text(run_cli, preset)
    assert f"{bpr} / {k} (n_generation) / {ranks} rank(s) = {per_rank // k} prompts x {k} images" in text
    assert (
        f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank, x {int(steps * fraction)} trained levels"
        in text
    )
    assert f"{k} drafts -> {k} kept per prompt, {steps} steps" in text
