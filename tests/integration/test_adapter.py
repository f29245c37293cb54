"""The SANA adapter on tiny pipelines: the adapter contract on the tiny SANA with a DC-AE (`sanarl-tiny:sana-dcae`),
then what only SANA has: the model call with the text mask, CFG batching, the pixel autoencoder, the complex human
instruction."""

from __future__ import annotations

import pytest
import torch
from adapter_contract import SCALED, AdapterContract, FamilyCase, ImageDataContract
from sana_family import DEFAULT_TARGETS, direct_velocity, pipeline_latents

from sanarl.config.schema import PolicyConfig
from sanarl.models import Cond, load_adapter
from sanarl.models.pixel_ae import PixelAutoencoder

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread", "no_metrics_plot")]


class TestContract(AdapterContract, ImageDataContract):
    case = FamilyCase(
        model="sanarl-tiny:sana-dcae", pipeline="SanaPipeline", grid="flow_match_euler", guidance=4.5,
        text_encoders=1, latents=SCALED, vae_config={"scaling_factor": 0.41}, shape_64x96=(4, 16, 24),
        size_error="34x32 is not divisible by the VAE factor 4", bad_size=(34, 32), pipeline_latents=pipeline_latents,
        direct_velocity=direct_velocity, diffusers={"complex_human_instruction": False},
        lora_overrides=(DEFAULT_TARGETS,), lora_targets=("attn1.to_q.lora_A", "attn2.to_out.0.lora_B"),
        lora_untouched=("ff.",),  # the attention projections only
    )  # fmt: skip


def policy(name: str, **diff) -> PolicyConfig:
    p = PolicyConfig(model_name_or_path=f"sanarl-tiny:{name}")
    p.diffusers.complex_human_instruction = False
    p.diffusers.max_prompt_length = 12
    for k, v in diff.items():
        setattr(p.diffusers, k, v)
    return p


@pytest.fixture(scope="module")
def dcae():
    return load_adapter(policy("sana-dcae"))


def test_velocity_is_the_transformer_at_timestep_1000_s_with_the_text_mask(dcae):
    cond = dcae.encode_prompts(["a red circle", "two blue squares above a green triangle"])
    assert cond.mask.tolist()[0][:4] == [1, 1, 1, 0]
    x = torch.randn(2, *dcae.latent_shape(32, 32))
    s = torch.tensor([0.3, 0.9])
    direct = dcae.transformer(
        x,
        encoder_hidden_states=cond.embeds,
        encoder_attention_mask=cond.mask,
        timestep=1000 * s,
        return_dict=False,
    )[0]
    assert torch.allclose(dcae.velocity(x, s, cond), direct)
    masked = Cond(cond.embeds.clone(), cond.mask)
    masked.embeds[0, 3:] = 99.0  # padding positions must not matter
    assert torch.allclose(dcae.velocity(x, s, masked)[0], direct[0], atol=1e-5)


def test_guided_velocity_is_the_cfg_formula(dcae):
    cond = dcae.encode_prompts(["a red circle"])
    uncond = dcae.encode_prompts([""])
    x = torch.randn(3, *dcae.latent_shape(32, 32))
    s = torch.tensor([0.2, 0.5, 0.7])
    v_c = dcae.velocity(x, s, cond)
    v_u = dcae.velocity(x, s, uncond)
    assert torch.allclose(dcae.guided_velocity(x, s, cond, uncond, 4.5), v_u + 4.5 * (v_c - v_u), atol=1e-5)
    assert torch.equal(dcae.guided_velocity(x, s, cond, uncond, 1.0), v_c)


def test_pixel_autoencoder_is_exactly_invertible():
    ae = PixelAutoencoder(factor=2)
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    z = ae.encode(x).latent
    assert z.shape == (2, 12, 4, 4) and torch.equal(ae.decode(z).sample, x)
    assert z[0, :4, 0, 0].tolist() == [x[0, 0, 0, 0].item(), x[0, 0, 0, 1].item(), x[0, 0, 1, 0].item(),
                                       x[0, 0, 1, 1].item()]  # fmt: skip
    with pytest.raises(ValueError, match="power of two"):
        PixelAutoencoder(factor=3)


def test_shapes_vocabulary_covers_every_caption():
    from sanarl.models.tiny import SHAPES_VOCABULARY
    from sanarl.worlds.shapes import caption_vocabulary

    assert set(caption_vocabulary()) <= set(SHAPES_VOCABULARY)


def test_complex_human_instruction_is_the_pipelines_own():
    """`complex_human_instruction = true` encodes as `SanaPipeline.encode_prompt` with the instruction
    `SanaPipeline.__call__` prepends by default (lines joined by newlines, in front of every prompt, the token budget
    lengthened by the instruction's tokens); false encodes without one; the two differ."""
    import inspect

    from diffusers import SanaPipeline

    instruction = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default
    assert instruction[0].startswith("Given a user prompt, generate an 'Enhanced prompt'")
    assert instruction[-1] == "User Prompt: "
    prompts = ["a red circle", "two blue squares above a green triangle"]
    on = load_adapter(policy("shapes", complex_human_instruction=True))
    off = load_adapter(policy("shapes"))
    with_chi, without = on.encode_prompts(prompts), off.encode_prompts(prompts)
    expected = on.pipeline.encode_prompt(prompts, do_classifier_free_guidance=False, device="cpu",
                                         max_sequence_length=12, complex_human_instruction=instruction)  # fmt: skip
    torch.testing.assert_close(with_chi.embeds, expected[0], rtol=0, atol=0)
    assert torch.equal(with_chi.mask, expected[1])
    plain = off.pipeline.encode_prompt(prompts, do_classifier_free_guidance=False, device="cpu",
                                       max_sequence_length=12, complex_human_instruction=None)  # fmt: skip
    torch.testing.assert_close(without.embeds, plain[0], rtol=0, atol=0)
    assert with_chi.embeds.shape == without.embeds.shape
    assert (with_chi.embeds - without.embeds).abs().max() > 1e-3


def test_guided_sampling_with_the_instruction_matches_the_pipelines_default_call():
    """`complex_human_instruction = true` with CFG: `SanaPipeline.__call__` with its defaults encodes the prompt with
    its instruction and the negative prompt "" without one; sanarl's guided sampling gives the same latents."""
    from adapter_contract import LENGTH, PROMPTS, SEEDS, STEPS, sample_sanarl

    on = load_adapter(policy("sana-dcae", complex_human_instruction=True, max_prompt_length=LENGTH))
    on.transformer.eval()
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]
    theirs = on.pipeline(
        prompt=[PROMPTS[0]] * len(SEEDS), num_inference_steps=STEPS, guidance_scale=4.5, height=32, width=32,
        max_sequence_length=LENGTH, use_resolution_binning=False, generator=generators, output_type="latent",
    ).images  # fmt: skip
    ours = sample_sanarl(on, 4.5)
    assert (ours - theirs).abs().max().item() < 1e-5
    negative = on.pipeline.encode_prompt([""], do_classifier_free_guidance=False, device="cpu",
                                         max_sequence_length=LENGTH, complex_human_instruction=None)  # fmt: skip
    torch.testing.assert_close(on.uncond_for(4.5).embeds, negative[0], rtol=0, atol=0)
    # a dropped training caption is that same unconditional prompt; a kept one has the instruction
    captions = on.encode_captions(list(PROMPTS), [False, True])
    torch.testing.assert_close(captions.embeds[0], negative[0][0], rtol=0, atol=0)
    torch.testing.assert_close(
        captions.select([1]).embeds, on.encode_prompts([PROMPTS[1]]).embeds, rtol=0, atol=0
    )
    assert torch.equal(captions.mask[0], negative[1][0])
