"""Tiny random-init SANA-Video pipelines built from config (tests and the CPU video presets).

- `sana-video`: the real SANA-Video path in miniature: SanaVideoTransformer3DModel (2 layers, width 16) over a tiny
  random-init AutoencoderKLWan (factor 8 in space, 4 in time, 4 latent channels with non-trivial per-channel
  `latents_mean` / `latents_std`, so the normalisation is exercised) and a 1-layer Gemma-2 text encoder with a
  word-level tokenizer. Video frames T must be 4 k + 1 (the Wan VAE keeps the first frame and packs 4 per latent).
- `shapes-video`: the CPU-trainable moving-shapes model. `PositionalSanaVideoTransformer3DModel` (SANA-Video's
  transformer plus a fixed 3-D sin-cos absolute position code, see its docstring) diffusing in pixel space through
  `PixelVideoAutoencoder` (an exactly invertible identity "VAE", factor 1 in space and time), 8 frames of 16 x 16 px,
  patch (1, 4, 4) -> 128 tokens; ~0.35M parameters (a step of 4 clips ~0.15 s fwd+bwd on one idle core); vocabulary
  = the shapes words plus the motion words.

`PixelVideoAutoencoder` and `PositionalSanaVideoTransformer3DModel` live here so diffusers can re-import them by this
module name when loading a saved pipeline (`import sanarl.models.tiny_video` before
`SanaVideoPipeline.from_pretrained(dir)` of a shapes-video export; model_index.json names this module).
"""

from __future__ import annotations

import functools

import torch
from diffusers import SanaVideoTransformer3DModel
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.vae import DecoderOutput, EncoderOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from sanarl.models.tiny import SHAPES_VOCABULARY, _gemma, sana_transformer, word_tokenizer

MOTION_WORDS: tuple[str, ...] = ("moving", "moves", "toward", "towards", "up", "down", "upward", "downward")
"""Words the moving-shapes captions add to the shapes vocabulary (a test checks every caption is covered)."""

VIDEO_VOCABULARY: tuple[str, ...] = SHAPES_VOCABULARY + MOTION_WORDS


class PixelVideoAutoencoder(ModelMixin, ConfigMixin):
    """Identity "VAE" for pixel-space video models: encode([B, C, T, H, W] in [-1, 1]) = the same tensor.

    Mirrors AutoencoderKLWan's config fields that SANA-Video code reads (`z_dim`, `scale_factor_temporal`,
    `scale_factor_spatial`, `latents_mean`, `latents_std`: zeros / ones, so the normalisation is the identity).
    No trainable weights.
    """

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        z_dim: int = 3,
        scale_factor_temporal: int = 1,
        scale_factor_spatial: int = 1,
        latents_mean: list[float] | None = None,
        latents_std: list[float] | None = None,
    ) -> None:
        """`z_dim` must equal `in_channels`; the factors must be 1; mean / std default to zeros / ones."""
        super().__init__()
        if z_dim != in_channels or scale_factor_temporal != 1 or scale_factor_spatial != 1:
            raise ValueError("PixelVideoAutoencoder is the identity: z_dim == in_channels and factors 1")
        self.register_to_config(
            latents_mean=list(latents_mean or [0.0] * z_dim), latents_std=list(latents_std or [1.0] * z_dim)
        )
        self.register_buffer("anchor", torch.zeros(1), persistent=True)  # lets diffusers infer device / dtype

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> EncoderOutput | tuple[torch.Tensor]:
        """x [B, C, T, H, W] -> latent [B, C, T, H, W] (unchanged)."""
        return EncoderOutput(latent=x) if return_dict else (x,)

    def decode(self, z: torch.Tensor, return_dict: bool = True) -> DecoderOutput | tuple[torch.Tensor]:
        """z [B, C, T, H, W] -> sample [B, C, T, H, W] (unchanged)."""
        return DecoderOutput(sample=z) if return_dict else (z,)


def sincos_1d(positions: torch.Tensor, channels: int) -> torch.Tensor:
    """Transformer sin-cos code of integer positions (Vaswani et al. 2017, sec. 3.5): [N] -> [N, channels].

    Column k < channels / 2 is sin(p w_k), column channels / 2 + k is cos(p w_k), with w_k = 10000^(-2k / channels).
    `channels` must be even.
    """
    half = channels // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64) * 2.0 / channels)
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_3d(frames: int, height: int, width: int, channels: int) -> torch.Tensor:
    """Fixed 3-D absolute position code of a (frame, row, col) token grid: [channels, frames, height, width].

    As DiT / PixArt's 2-D sin-cos table, extended to three axes: each axis gets `2 * (channels // 6)` channels of
    `sincos_1d` of its integer index (frame t, row i, col j), in that order; the remaining channels (channels mod 6,
    plus rounding) are zero. float32.
    """
    per_axis = 2 * (channels // 6)
    code = torch.zeros(channels, frames, height, width, dtype=torch.float64)
    for axis, n in enumerate((frames, height, width)):
        table = sincos_1d(torch.arange(n), per_axis).T  # [per_axis, n]
        shape = [per_axis, 1, 1, 1]
        shape[axis + 1] = n
        code[axis * per_axis : (axis + 1) * per_axis] = table.reshape(shape)
    return code.float()


class PositionalPatchEmbed3d(nn.Conv3d):
    """SANA-Video's patch embedding (a strided Conv3d, same weights and state-dict keys) plus `sincos_3d` of the
    output grid: x [B, C_in, T, H, W] -> [B, D, T / p_t, H / p_h, W / p_w]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        _, channels, frames, height, width = out.shape
        return out + sincos_3d(frames, height, width, channels).to(out.device, out.dtype)


class PositionalSanaVideoTransformer3DModel(SanaVideoTransformer3DModel):
    """SanaVideoTransformer3DModel with a fixed 3-D sin-cos absolute position code added after the patch embedding.

    A deliberate deviation from real SANA-Video, for the CPU stand-in only. SANA-Video has no absolute position
    information: its 3-D RoPE is relative, its linear attention cannot attend sharply, and only the zero padding of
    the Mix-FFN convolutions leaks where a token is. At 480x832 that is enough, but the tiny moving-shapes model
    (8 x 4 x 4 tokens) must put the object at frame-dependent absolute positions ("moving right" starts in the left
    40% and ends in the right 40%); without a position code its mean prediction from pure noise was measured static
    in the centre for every direction. The code (`sincos_3d`, as DiT / PixArt add a 2-D one) makes that mapping
    representable; whether training ties it to the caption's direction word is measured in docs/video.md. It has no
    parameters and no config keys: the constructor, the config, the state-dict keys and the LoRA targets are exactly
    SanaVideoTransformer3DModel's.
    """

    @functools.wraps(SanaVideoTransformer3DModel.__init__)
    def __init__(self, *args, **kwargs) -> None:
        """SanaVideoTransformer3DModel's arguments (functools.wraps exposes its signature, which diffusers reads to
        save and reload the config); the patch embedding keeps its weights and gains the position code."""
        super().__init__(*args, **kwargs)
        conv = self.patch_embedding
        self.patch_embedding = PositionalPatchEmbed3d(
            conv.in_channels, conv.out_channels, kernel_size=conv.kernel_size, stride=conv.stride
        )
        self.patch_embedding.load_state_dict(conv.state_dict())


def _transformer(
    in_channels: int,
    heads: int,
    head_dim: int,
    layers: int,
    caption: int,
    patch: tuple,
    cls: type = SanaVideoTransformer3DModel,
):
    """The tiny video transformer: `tiny.sana_transformer` with the video model's MLP ratio and RoPE length."""
    return sana_transformer(
        in_channels, heads, head_dim, layers, caption, patch, cls=cls, mlp_ratio=2.0, rope_max_seq_len=64
    )


def build_sana_video_pipeline(seed: int = 0):
    """Tiny SANA-Video with a random-init Wan VAE (spatial 8, temporal 4, 4 latent channels)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, SanaVideoPipeline

    torch.manual_seed(seed)
    tokenizer = word_tokenizer(VIDEO_VOCABULARY)
    vae = AutoencoderKLWan(
        base_dim=4,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 0.8, 1.2, 2.0],
        scale_factor_temporal=4,
        scale_factor_spatial=8,
    )
    return SanaVideoPipeline(
        tokenizer=tokenizer,
        text_encoder=_gemma(len(tokenizer), 32),
        vae=vae,
        transformer=_transformer(4, heads=2, head_dim=8, layers=2, caption=32, patch=(1, 1, 1)),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )


def build_shapes_video_pipeline(seed: int = 0):
    """The CPU moving-shapes model: pixel-space SANA-Video with absolute positions, 16 x 16 px clips, patch (1, 4, 4)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaVideoPipeline

    torch.manual_seed(seed)
    tokenizer = word_tokenizer(VIDEO_VOCABULARY)
    return SanaVideoPipeline(
        tokenizer=tokenizer,
        text_encoder=_gemma(len(tokenizer), 64),
        vae=PixelVideoAutoencoder(in_channels=3, z_dim=3),
        transformer=_transformer(
            3,
            heads=4,
            head_dim=16,
            layers=4,
            caption=64,
            patch=(1, 4, 4),
            cls=PositionalSanaVideoTransformer3DModel,
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
    )
