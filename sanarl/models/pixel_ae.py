"""An exactly invertible "autoencoder" for pixel-space tiny models.

A learned tiny VAE loses too much detail for the shapes judge, so the embedded CPU model diffuses in pixel space.
`PixelAutoencoder` keeps the VAE seam intact: it saves and loads like any diffusers component, and its
`encode(x).latent` / `decode(z).sample` mirror AutoencoderDC's outputs. With `factor = f` it rearranges each
f x f pixel block into channels (space-to-depth), so a [B, 3, H, W] image in [-1, 1] becomes
[B, 3 f^2, H/f, W/f]; `decode` is the exact inverse.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.vae import DecoderOutput, EncoderOutput
from diffusers.models.modeling_utils import ModelMixin


class PixelAutoencoder(ModelMixin, ConfigMixin):
    """Space-to-depth by `factor` (1 = identity). No trainable weights."""

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        factor: int = 1,
        scaling_factor: float = 1.0,
        encoder_block_out_channels: list[int] | None = None,
    ) -> None:
        """`encoder_block_out_channels` is derived from `factor` (any given value is replaced)."""
        super().__init__()
        if factor < 1 or factor & (factor - 1):
            raise ValueError(f"PixelAutoencoder factor must be a power of two, got {factor}")
        # SanaPipeline derives its vae_scale_factor as 2 ** (len(encoder_block_out_channels) - 1).
        self.register_to_config(encoder_block_out_channels=[in_channels] * factor.bit_length())
        # A zero-size buffer lets diffusers infer device and dtype of a module without parameters.
        self.register_buffer("anchor", torch.zeros(1), persistent=True)

    @property
    def latent_channels(self) -> int:
        return self.config.in_channels * self.config.factor**2

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> EncoderOutput | tuple[torch.Tensor]:
        """x: [B, C, H, W] in [-1, 1] -> latent [B, C f^2, H/f, W/f]."""
        f = self.config.factor
        z = x if f == 1 else F.pixel_unshuffle(x, f)
        return EncoderOutput(latent=z) if return_dict else (z,)

    def decode(self, z: torch.Tensor, return_dict: bool = True) -> DecoderOutput | tuple[torch.Tensor]:
        """z: [B, C f^2, h, w] -> image [B, C, h f, w f] (same range as the encoder input)."""
        f = self.config.factor
        x = z if f == 1 else F.pixel_shuffle(z, f)
        return DecoderOutput(sample=x) if return_dict else (x,)
