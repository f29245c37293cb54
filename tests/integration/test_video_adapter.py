"""The SANA-Video adapter on the tiny random-init SANA-Video (Wan VAE): sampling equals `SanaVideoPipeline.__call__`,
the latent normalisation is the pipeline's, latent shapes follow the frame rule, and the export reloads in diffusers.

Oracle for sampling: the pipeline itself with its own defaults (no `sigmas`: its scheduler's `set_timesteps(N)`
grid), fed the adapter's prompt embeddings, the same per-sample seeds, CFG with the encoding of "" as the negative
prompt, and `output_type="latent"` (as tests/integration/test_sampler_matches_diffusers.py does for images).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sanarl.config.schema import PolicyConfig
from sanarl.errors import ConfigError
from sanarl.training.sampling import GenerationSpec, generate_images, generate_latents

pytestmark = pytest.mark.slow

STEPS = 4
SIZE = 32
FRAMES = 9
SEEDS = [11, 12]
PROMPT = "a red circle moving left"
TOLERANCE = 1e-4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def adapter():
    from sanarl.models import load_adapter

    policy = PolicyConfig(model_name_or_path="sanarl-tiny:sana-video")
    policy.diffusers.is_video = True
    policy.diffusers.complex_human_instruction = False
    policy.diffusers.max_prompt_length = 8
    policy.diffusers.inference_frames = FRAMES
    policy.diffusers.train_frames = 5
    adapter = load_adapter(policy)
    adapter.transformer.eval()
    return adapter


def _spec(adapter, guidance: float) -> GenerationSpec:
    return GenerationSpec(STEPS, guidance, "euler", 0.0, adapter.default_shift, SIZE, SIZE)


def _sanarl(adapter, guidance: float) -> torch.Tensor:
    cond = adapter.encode_prompts([PROMPT] * len(SEEDS))
    uncond = adapter.encode_prompts([""]) if guidance != 1.0 else None
    return generate_latents(adapter, cond, SEEDS, _spec(adapter, guidance), uncond=uncond).latents


def _diffusers(adapter, guidance: float, output_type: str = "latent"):
    cond = adapter.encode_prompts([PROMPT] * len(SEEDS))
    extra = {}
    if guidance > 1.0:
        neg = adapter.encode_prompts([""]).expand_to(len(SEEDS))
        extra = {
            "negative_prompt_embeds": neg.embeds.contiguous(),
            "negative_prompt_attention_mask": neg.mask,
        }
    return adapter.pipeline(
        prompt_embeds=cond.embeds,
        prompt_attention_mask=cond.mask,
        negative_prompt=None,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        height=SIZE,
        width=SIZE,
        frames=FRAMES,
        generator=[torch.Generator().manual_seed(s) for s in SEEDS],
        output_type=output_type,
        use_resolution_binning=False,
        **extra,
    ).frames


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_final_latents_match_the_pipeline(adapter, guidance):
    ours, theirs = _sanarl(adapter, guidance), _diffusers(adapter, guidance)
    assert adapter.grid_name() == "flow_match_euler"
    assert ours.shape == theirs.shape == (len(SEEDS), 4, 3, 4, 4)  # C=4, T'=(9-1)//4+1, 32/8
    assert (ours - theirs).abs().max().item() < TOLERANCE
    assert (ours[1] - ours[0]).abs().max().item() > 1e-2  # not vacuous: seeds differ


def test_decoded_clips_match_the_pipeline_output(adapter):
    """generate_images = decode(latents): the pipeline's own decode (un-normalise, Wan decode, [0, 1]) frame by frame."""
    ours = generate_images(adapter, [PROMPT] * len(SEEDS), SEEDS, _spec(adapter, 1.0))
    theirs = _diffusers(adapter, 1.0, output_type="pt")  # [B, T, 3, H, W] in [0, 1]
    assert ours.shape == (len(SEEDS), 3, FRAMES, SIZE, SIZE)
    torch.testing.assert_close(ours, theirs.permute(0, 2, 1, 3, 4).float(), atol=1e-4, rtol=0)


def test_latent_normalisation_is_the_per_channel_wan_one(adapter):
    """encode = (mode - mean_c) / std_c with the VAE config's values; decode undoes it exactly before the VAE."""
    torch.manual_seed(0)
    clips = torch.rand(1, 3, 5, SIZE, SIZE)
    raw = adapter.vae.encode(2 * clips - 1).latent_dist.mode()
    mean = torch.tensor([0.1, -0.2, 0.3, 0.0]).view(1, 4, 1, 1, 1)
    std = torch.tensor([1.5, 0.8, 1.2, 2.0]).view(1, 4, 1, 1, 1)
    z = adapter.encode_images(clips)
    torch.testing.assert_close(z, (raw - mean) / std, atol=1e-5, rtol=0)
    expected = ((adapter.vae.decode(raw).sample + 1) / 2).clamp(0, 1)
    torch.testing.assert_close(adapter.decode(z), expected, atol=1e-5, rtol=0)


def test_latent_shape_uses_inference_frames_unless_given(adapter):
    assert adapter.latent_shape(SIZE, 64) == (4, 3, 4, 8)  # inference_frames 9 -> 1 + 8 // 4
    assert adapter.latent_shape(SIZE, SIZE, frames=5) == (4, 2, 4, 4)
    assert adapter.latent_shape(SIZE, SIZE, frames=1) == (4, 1, 4, 4)
    with pytest.raises(ConfigError, match=r"1 \+ 4 k frames.*train_frames"):
        adapter.latent_shape(SIZE, SIZE, frames=8)
    with pytest.raises(ConfigError, match=r"inference_size"):
        adapter.latent_shape(36, SIZE)


def test_saved_pipeline_loads_in_diffusers(adapter, tmp_path):
    from diffusers import DiffusionPipeline, SanaVideoPipeline

    adapter.save_pipeline(tmp_path / "export")
    pipe = DiffusionPipeline.from_pretrained(str(tmp_path / "export"))
    assert isinstance(pipe, SanaVideoPipeline)
    for name, value in adapter.transformer.state_dict().items():
        assert torch.equal(pipe.transformer.state_dict()[name], value), name


# ----------------------------------------------------------------------------------------------------------------
# The moving-shapes model's absolute position code (PositionalSanaVideoTransformer3DModel)
# ----------------------------------------------------------------------------------------------------------------


def test_sincos_1d_hand_values():
    from sanarl.models.tiny_video import sincos_1d

    code = sincos_1d(torch.tensor([0, 1, 3]), 4)  # w = (1, 10000^-1/2 = 0.01)
    expected = [
        [0.0, 0.0, 1.0, 1.0],
        [np.sin(1.0), np.sin(0.01), np.cos(1.0), np.cos(0.01)],
        [np.sin(3.0), np.sin(0.03), np.cos(3.0), np.cos(0.03)],
    ]
    torch.testing.assert_close(code, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def test_sincos_3d_gives_each_axis_its_own_channel_block():
    from sanarl.models.tiny_video import sincos_1d, sincos_3d

    code = sincos_3d(3, 2, 4, 14)  # 2 * (14 // 6) = 4 channels per axis, channels 12-13 zero
    assert code.shape == (14, 3, 2, 4) and code.dtype == torch.float32
    for t, i, j in [(0, 0, 0), (2, 1, 3), (1, 0, 2)]:
        column = code[:, t, i, j].double()
        torch.testing.assert_close(column[0:4], sincos_1d(torch.tensor([t]), 4)[0], atol=1e-7, rtol=0)
        torch.testing.assert_close(column[4:8], sincos_1d(torch.tensor([i]), 4)[0], atol=1e-7, rtol=0)
        torch.testing.assert_close(column[8:12], sincos_1d(torch.tensor([j]), 4)[0], atol=1e-7, rtol=0)
        assert column[12:].abs().max().item() == 0.0
    flat = code.flatten(1).T  # [tokens, channels]: every (frame, row, col) token has a distinct code
    assert torch.cdist(flat, flat).add(torch.eye(len(flat)) * 10).min().item() > 0.1


@pytest.fixture(scope="module")
def shapes_video_pipeline():
    from diffusers import SanaVideoPipeline

    import sanarl.models.tiny_video  # noqa: F401  (diffusers re-imports the model classes by this module name)
    from sanarl.models.tiny import ensure_tiny_pipeline

    return SanaVideoPipeline.from_pretrained(str(ensure_tiny_pipeline("shapes-video")))


def test_position_code_is_added_to_the_patch_embedding_and_nothing_else(shapes_video_pipeline):
    """Oracle: the plain SanaVideoTransformer3DModel with the same weights and a hook adding sincos_3d to the patch
    embedding output gives the same velocity; without the hook it differs (the code is not vacuous)."""
    from diffusers import SanaVideoTransformer3DModel

    from sanarl.models.tiny_video import PositionalSanaVideoTransformer3DModel, sincos_3d

    ours = shapes_video_pipeline.transformer
    assert isinstance(ours, PositionalSanaVideoTransformer3DModel)
    plain = SanaVideoTransformer3DModel.from_config(ours.config)
    width = ours.config.num_attention_heads * ours.config.attention_head_dim
    plain.load_state_dict(ours.state_dict())  # same keys: LoRA targets and checkpoints are unchanged
    torch.manual_seed(0)
    x, text, step = torch.randn(2, 3, 8, 16, 16), torch.randn(2, 4, 64), torch.tensor([900.0, 300.0])
    with torch.no_grad():
        expected_without = plain(x, encoder_hidden_states=text, timestep=step)[0]
        hook = plain.patch_embedding.register_forward_hook(lambda m, i, out: out + sincos_3d(8, 4, 4, width))
        expected = plain(x, encoder_hidden_states=text, timestep=step)[0]
        hook.remove()
        got = ours(x, encoder_hidden_states=text, timestep=step)[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert (got - expected_without).abs().max().item() > 1e-2


def test_positional_transformer_round_trips_through_diffusers(shapes_video_pipeline, tmp_path):
    """model_index.json names this module, so SanaVideoPipeline.from_pretrained rebuilds the subclass with the same
    config and weights."""
    import json

    from diffusers import SanaVideoPipeline

    from sanarl.models.tiny_video import PositionalPatchEmbed3d

    shapes_video_pipeline.save_pretrained(str(tmp_path))
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["transformer"] == ["sanarl.models.tiny_video", "PositionalSanaVideoTransformer3DModel"]
    loaded = SanaVideoPipeline.from_pretrained(str(tmp_path)).transformer
    assert isinstance(loaded.patch_embedding, PositionalPatchEmbed3d)
    config = {k: v for k, v in loaded.config.items() if k != "_name_or_path"}
    assert config == {
        k: v for k, v in shapes_video_pipeline.transformer.config.items() if k != "_name_or_path"
    }
    assert config["_class_name"] == "PositionalSanaVideoTransformer3DModel" and config["patch_size"] == [
        1,
        4,
        4,
    ]
    for name, value in shapes_video_pipeline.transformer.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
