"""The SANA-Video adapter on the tiny random-init SANA-Video (Wan VAE, `sanarl-tiny:sana-video`): the adapter
contract (sampling equals `SanaVideoPipeline.__call__`, the Wan VAE's per-channel normalisation, the exports reload
in diffusers) with 9-frame generation and 5-frame training clips, then the frame rule of the latent shape and the
moving-shapes model's position code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_contract import PER_CHANNEL, SHAPES, AdapterContract, FamilyCase
from sana_family import DEFAULT_TARGETS, direct_velocity, pipeline_latents

from sanarl.errors import ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread", "no_metrics_plot")]

FRAMES = 9
"""`inference_frames`: 1 + 2 x 4 (the Wan VAE's temporal factor)."""


def video_latents(pipe, prompts: list[str], guidance: float, generators) -> torch.Tensor:
    """`SanaVideoPipeline.__call__` with its defaults for `FRAMES` frames."""
    return pipeline_latents(pipe, prompts, guidance, generators, frames=FRAMES)


class TestContract(AdapterContract):
    case = FamilyCase(
        model="sanarl-tiny:sana-video", pipeline="SanaVideoPipeline", grid="flow_match_euler", guidance=4.5,
        text_encoders=1, latents=PER_CHANNEL,
        vae_config={"latents_mean": [0.1, -0.2, 0.3, 0.0], "latents_std": [1.5, 0.8, 1.2, 2.0]},
        shape_64x96=(4, 3, 8, 12),  # C = 4, T' = (9 - 1) // 4 + 1, 64 / 8 x 96 / 8
        size_error="inference_size", size_error_type=ConfigError, clip_frames=5,
        pipeline_latents=video_latents, direct_velocity=direct_velocity,
        diffusers={"is_video": True, "complex_human_instruction": False, "inference_frames": FRAMES,
                   "train_frames": 5},
        sft_plugin=SHAPES, lora_overrides=(DEFAULT_TARGETS,),
        lora_targets=("attn1.to_q.lora_A", "attn2.to_out.0.lora_B"), lora_untouched=("ff.",),
        tolerance=1e-4, decode_atol=1e-5,
    )  # fmt: skip


@pytest.fixture(scope="module")
def adapter():
    from sanarl.models import load_adapter

    return load_adapter(TestContract.case.policy())


def test_latent_shape_uses_inference_frames_unless_given(adapter):
    assert adapter.latent_shape(32, 64) == (4, 3, 4, 8)  # inference_frames 9 -> 1 + 8 // 4
    assert adapter.latent_shape(32, 32, frames=5) == (4, 2, 4, 4)
    assert adapter.latent_shape(32, 32, frames=1) == (4, 1, 4, 4)
    with pytest.raises(ConfigError, match=r"1 \+ 4 k frames.*train_frames"):
        adapter.latent_shape(32, 32, frames=8)


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
