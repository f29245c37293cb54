"""The FLUX.1 adapter on the tiny random-init FLUX.1-dev (`sanarl-tiny:flux`): oracles are diffusers' own
`FluxPipeline` (encode_prompt, __call__, VAE) and hand computations of the packing, position ids, guidance embedding
and resolution shift; then every task (and every DiffusionNFT rollout family) runs on it through `sanarl.api.train`
with the SD3 test presets, the model swapped by one override (no family-specific code), and its exports load back
into diffusers.

Sampler oracle: `FluxPipeline.__call__` fed the same prompt text and per-sample seeds, its default
`sigmas = linspace(1, 1/N, N)` shifted by its own `calculate_shift` mu, the embedded guidance, `output_type="latent"`
(packed tokens, unpacked with the pipeline's `_unpack_latents`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import adapter_contract as contract
import numpy as np
import pytest
import torch
from adapter_contract import LENGTH, PRESETS, PROMPTS, SHAPES, SQUARES, STEPS, finite_records

from sanarl import api
from sanarl.config.schema import PolicyConfig
from sanarl.methods.config_loading import load_config
from sanarl.models import load_adapter

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread", "no_metrics_plot")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from rollout_families import FAMILIES, check_family_run, record_compiles  # noqa: E402

TOLERANCE = 1e-4
FLUX = "policy.model_name_or_path=sanarl-tiny:flux"
"""The override that turns an SD3 test preset into a FLUX one."""
DEFAULT_TARGETS = "policy.lora.target_modules=[]"
"""LoRA presets: the family's default targets instead of SD3's."""


def _policy(guidance: float = 3.5) -> PolicyConfig:
    policy = PolicyConfig(model_name_or_path="sanarl-tiny:flux")
    policy.diffusers.max_prompt_length = LENGTH
    policy.diffusers.sample.guidance_scale = guidance
    return policy


@pytest.fixture(scope="module")
def flux():
    adapter = load_adapter(_policy())
    adapter.transformer.eval()
    return adapter


# --- prompts ------------------------------------------------------------------------------------------------------
def test_encode_prompts_is_t5_tokens_and_clip_pooled(flux):
    pipe = flux.pipeline
    cond = flux.encode_prompts(PROMPTS)
    embeds, pooled, text_ids = pipe.encode_prompt(PROMPTS, None, max_sequence_length=LENGTH)
    assert cond.mask is None and cond.embeds.shape == (2, LENGTH, 32) and cond.pooled.shape == (2, 16)
    assert torch.equal(cond.embeds, embeds) and torch.equal(cond.pooled, pooled)
    assert torch.equal(text_ids, torch.zeros(LENGTH, 3))
    ids = pipe.tokenizer_2(
        PROMPTS, padding="max_length", max_length=LENGTH, truncation=True, return_tensors="pt"
    )
    torch.testing.assert_close(cond.embeds, pipe.text_encoder_2(ids.input_ids)[0])
    clip_ids = pipe.tokenizer(PROMPTS, padding="max_length", max_length=16, return_tensors="pt").input_ids
    torch.testing.assert_close(cond.pooled, pipe.text_encoder(clip_ids).pooler_output)


# --- packing, position ids, guidance, shift -----------------------------------------------------------------------
def test_packing_is_2x2_patches_channel_major():
    from sanarl.models.flux import image_ids, pack, unpack

    z = torch.randn(2, 4, 6, 8)
    tokens = pack(z)
    assert tokens.shape == (2, 12, 16)
    # token (i, j) = row-major patch index i * 4 + j; feature c * 4 + 2 dy + dx = z[c, 2i + dy, 2j + dx]
    i, j, c, dy, dx = 1, 2, 3, 1, 0
    assert tokens[1, i * 4 + j, c * 4 + 2 * dy + dx] == z[1, c, 2 * i + dy, 2 * j + dx]
    assert torch.equal(unpack(tokens, 6, 8), z)
    ids = image_ids(3, 4, torch.device("cpu"))
    assert ids.shape == (12, 3) and ids[i * 4 + j].tolist() == [0.0, i, j]


def test_velocity_is_the_transformer_on_packed_tokens_with_ids_and_guidance(flux):
    pipe = flux.pipeline
    cond = flux.encode_prompts(PROMPTS)
    x = torch.randn(2, *flux.latent_shape(32, 32))
    s = torch.tensor([0.3, 0.9])
    packed = pipe._pack_latents(x, 2, 4, 8, 8)
    direct = pipe.transformer(
        hidden_states=packed,
        timestep=s,
        guidance=torch.full((2,), 3.5),
        pooled_projections=cond.pooled,
        encoder_hidden_states=cond.embeds,
        txt_ids=torch.zeros(LENGTH, 3),
        img_ids=pipe._prepare_latent_image_ids(2, 4, 4, "cpu", torch.float32),
        return_dict=False,
    )[0]
    ours = flux.velocity(x, s, cond)
    assert torch.equal(ours, pipe._unpack_latents(direct, 32, 32, pipe.vae_scale_factor))
    # guided_velocity: one forward at the embedded guidance, no CFG batch (the uncond is ignored)
    other = flux.guided_velocity(x, s, cond, flux.encode_prompts([""]), 1.0)
    assert torch.equal(flux.guided_velocity(x, s, cond, None, 1.0), other)
    assert (other - ours).abs().max() > 1e-3  # the guidance embedding is really used
    no_pool = type(cond)(cond.embeds, None, torch.zeros_like(cond.pooled))
    assert (flux.velocity(x, s, no_pool) - ours).abs().max() > 1e-3


def test_shift_grows_with_resolution_as_calculate_shift(flux):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    for size, tokens in ((32, 16), (256, 1024), (512, 4096)):
        assert flux.shift_for(size, size) == pytest.approx(math.exp(calculate_shift(tokens)), rel=1e-12)
    assert flux.shift_for(512, 512) == pytest.approx(math.exp(1.15))  # max_shift at 4096 tokens
    assert flux.default_shift == flux.shift_for(512, 512)  # default_sample_size 128 x VAE factor 4


def test_grid_is_the_pipeline_schedulers_grid(flux):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    from sanarl.core.flow import sigma_grid

    sched = flux.pipeline.scheduler
    sched.set_timesteps(sigmas=list(np.linspace(1.0, 1.0 / STEPS, STEPS)), mu=calculate_shift(16))
    torch.testing.assert_close(sched.sigmas, sigma_grid(STEPS, flux.shift_for(32, 32)), atol=1e-6, rtol=0)


def _pipeline_latents(pipe, prompts: list[str], guidance: float, generators) -> torch.Tensor:
    """`FluxPipeline.__call__` with its defaults, its packed latents unpacked by its own helper."""
    packed = pipe(
        prompt=prompts, num_inference_steps=STEPS, guidance_scale=guidance, height=32, width=32,
        max_sequence_length=LENGTH, generator=generators, output_type="latent",
    ).images  # fmt: skip
    return pipe._unpack_latents(packed, 32, 32, pipe.vae_scale_factor)


def pack_free_velocity(pipe, x, s, cond, guidance: float, transformer=None) -> torch.Tensor:
    """`transformer` (default: the pipeline's) called directly, packing and ids by the pipeline's own helpers, at
    `guidance`."""
    out = (transformer or pipe.transformer)(
        hidden_states=pipe._pack_latents(x, 2, 4, 8, 8),
        timestep=s,
        guidance=torch.full((2,), guidance),
        pooled_projections=cond.pooled,
        encoder_hidden_states=cond.embeds,
        txt_ids=torch.zeros(cond.embeds.shape[1], 3),
        img_ids=pipe._prepare_latent_image_ids(2, 4, 4, "cpu", torch.float32),
        return_dict=False,
    )[0]
    return pipe._unpack_latents(out, 32, 32, pipe.vae_scale_factor)


class TestContract(contract.AdapterContract, contract.T5Contract, contract.ImageDataContract):
    case = contract.FamilyCase(
        model="sanarl-tiny:flux", pipeline="FluxPipeline", grid="linspace", guidance=3.5, text_encoders=2,
        latents=contract.SHIFTED_SCALED, vae_config={"shift_factor": 0.1159, "scaling_factor": 0.3611},
        shape_64x96=(4, 16, 24),
        size_error="not divisible by 8 \\(VAE factor 4 x 2 x 2 packing\\)",
        pipeline_latents=_pipeline_latents, direct_velocity=pack_free_velocity,
        overrides=(FLUX,), lora_overrides=(DEFAULT_TARGETS,), tolerance=TOLERANCE,
        lora_targets=("single_transformer_blocks.0.attn.to_q.lora_A", "transformer_blocks.0.attn.to_out.0.lora_B"),
        lora_untouched=("add_q_proj", "proj_mlp"),  # Sol-RL's four targets only
    )  # fmt: skip


def test_training_latents_sample_the_posterior_as_diffusers_flux_scripts(flux):
    """diffusers' FLUX training scripts encode with `latent_dist.sample()`: z = (mean + std eps - shift) * scale
    with eps from the training step's seeded generator; `vae_latents = "mode"` gives the mean."""
    from sanarl.methods.sft.task import draw_vae_noise, encode_media

    images = torch.rand(2, 3, 32, 32)
    dist = flux.vae.encode(2 * images - 1).latent_dist
    assert flux.latent_sampling  # the default, vae_latents = "sample"
    drawn = draw_vae_noise(flux, 2, flux.latent_shape(32, 32), torch.Generator().manual_seed(0))
    z = encode_media(flux, images, drawn)
    torch.testing.assert_close(z, (dist.mean + dist.std * drawn["vae_noise"] - 0.1159) * 0.3611)
    assert not torch.allclose(z, flux.encode_images(images))
    policy = PolicyConfig(model_name_or_path="sanarl-tiny:flux")
    policy.diffusers.max_prompt_length = LENGTH
    policy.diffusers.vae_latents = "mode"
    mode = load_adapter(policy)
    assert draw_vae_noise(mode, 2, mode.latent_shape(32, 32), torch.Generator()) == {}
    torch.testing.assert_close(
        mode.encode_images(images, noise=drawn["vae_noise"]), (dist.mean - 0.1159) * 0.3611
    )


# --- every task on FLUX -------------------------------------------------------------------------------------------
def _train(preset: str, out: Path, plugin: str, *extra: str) -> api.TrainOutcome:
    lora = "lora" in preset or "nft" in preset or "grpo" in preset
    overrides = [f"train.output_dir={out}", FLUX, *([DEFAULT_TARGETS] if lora else []), *extra]
    loaded = load_config(PRESETS / preset, overrides)
    return api.train(loaded, plugin)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_nft_iteration_with_every_rollout_family(tmp_path, monkeypatch, family):
    from sanarl.core.lora import adapter_parameters

    compiled = record_compiles(monkeypatch)
    outcome = _train("sd3-nft.toml", tmp_path, SHAPES, *FAMILIES[family])
    records = finite_records(tmp_path, 1)
    lora_b = adapter_parameters(outcome.task.adapter.transformer, "default")
    assert sum(v.abs().max() > 0 for k, v in lora_b.items() if "lora_B" in k) >= 6
    check_family_run(outcome, records, compiled)


@pytest.mark.parametrize("cfg_in_training", [True, False])
def test_flow_grpo_iteration_with_embedded_guidance(tmp_path, cfg_in_training):
    from sanarl.core.lora import adapter_parameters, adapters_disabled

    flag = f"train.train_policy.cfg_in_training={str(cfg_in_training).lower()}"
    outcome = _train("sd3-grpo.toml", tmp_path, SHAPES, flag)
    finite_records(tmp_path, 1)
    task, adapter = outcome.task, outcome.task.adapter
    assert task.rollouts.uncond is None  # guidance 2 is embedded: no CFG batch, no empty prompt
    default = adapter_parameters(adapter.transformer, "default")
    assert any(v.abs().max() > 0 for k, v in default.items() if "lora_B" in k)
    # the policy and the KL reference run at the rollout's embedded guidance whatever cfg_in_training says
    cond = adapter.encode_prompts(PROMPTS)
    x, s = torch.randn(2, 4, 8, 8), torch.tensor([0.4, 0.8])
    with torch.no_grad():
        policy_at_2 = pack_free_velocity(adapter.pipeline, x, s, cond, 2.0, adapter.transformer)
        torch.testing.assert_close(task._policy_velocity(x, s, cond), policy_at_2)
        with adapters_disabled(adapter.trainable_module()):
            base_at_2 = pack_free_velocity(adapter.pipeline, x, s, cond, 2.0, adapter.transformer)
    torch.testing.assert_close(task._reference_velocity(x, s, cond), base_at_2)


@pytest.mark.parametrize("frozen_float32", [False, True], ids=["bf16-base", "float32-base"])
def test_lora_keeps_the_frozen_base_in_the_preset_dtype(tmp_path, frozen_float32):
    """LoRA over a bf16 base: the frozen transformer stays bf16 (frozen_base_float32 = false, the default), only the
    adapters are float32 and train; frozen_base_float32 = true holds the whole transformer in float32."""
    outcome = _train(
        "sd3-sft-lora.toml",
        tmp_path,
        SQUARES,
        "policy.diffusers.dtype=bfloat16",
        f"policy.diffusers.frozen_base_float32={str(frozen_float32).lower()}",
    )
    finite_records(tmp_path, 1)
    params = dict(outcome.task.adapter.transformer.named_parameters())
    frozen = {p.dtype for n, p in params.items() if "lora_" not in n}
    assert frozen == ({torch.float32} if frozen_float32 else {torch.bfloat16})
    assert {p.dtype for n, p in params.items() if "lora_" in n} == {torch.float32}
    trained = [n for n, p in params.items() if p.requires_grad]
    assert trained and all(".default." in n and "lora_" in n for n in trained)
