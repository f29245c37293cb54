"""SANA-Video adapter (diffusers `SanaVideoPipeline`: SanaVideoTransformer3DModel, Wan VAE, Gemma-2).

Media are clips `[B, 3, T, H, W]` in [0, 1]; latents are `[B, C, T', h, w]` with `T' = (T - 1) // f_t + 1` and
`h = H / f_s` (Wan VAE: f_t = 4, f_s = 8). The latent normalisation is the Wan VAE's per-channel one, exactly the
inverse of what `SanaVideoPipeline.__call__` undoes before decoding:

    encode:  z = (mode(q(z | 2 x - 1)) - mean_c) / std_c        decode:  x = (D(z * std_c + mean_c) + 1) / 2

(`vae.config.latents_mean` / `latents_std`, one value per latent channel c; the posterior mode keeps encoding
deterministic). The transformer is called with `timestep = 1000 s` and the text mask as `encoder_attention_mask`,
as the pipeline does with its flow-matching scheduler.

Frames: `latent_shape(h, w)` generates `policy.diffusers.inference_frames`; a task that encodes data passes the
clip's own frame count (`latent_shape(h, w, frames=T)`), so tasks never need to know which family they drive.
"""

from __future__ import annotations

import torch
from diffusers import SanaVideoPipeline
from torch import nn

from sanarl.config.schema import PolicyConfig
from sanarl.errors import ConfigError
from sanarl.models import tiny_video  # noqa: F401  (diffusers loads the pixel-space VAE by this module name)
from sanarl.models.sana import GemmaSanaAdapter

FRAMES_KEY = "policy.diffusers.inference_frames"


def vae_factors(vae: nn.Module) -> tuple[int, int]:
    """(temporal, spatial) compression of a SANA-Video VAE, read from its config like the pipeline does."""
    cfg = vae.config
    if "temporal_compression_ratio" in cfg:  # LTX-2 video VAE
        return int(cfg.temporal_compression_ratio), int(cfg.spatial_compression_ratio)
    return int(cfg.get("scale_factor_temporal", 4) or 4), int(cfg.get("scale_factor_spatial", 8) or 8)


def latent_stats(vae: nn.Module, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel (mean [C], std [C]) of the latent normalisation; zeros / ones when the VAE defines none."""
    buffers = dict(vae.named_buffers(recurse=False))  # LTX-2 keeps them as buffers, Wan in its config
    mean, std = buffers.get("latents_mean"), buffers.get("latents_std")
    if mean is None:
        mean = vae.config.get("latents_mean", None)
        std = vae.config.get("latents_std", None)
    if mean is None or std is None:
        return torch.zeros(channels), torch.ones(channels)
    return torch.as_tensor(mean, dtype=torch.float32).flatten(), torch.as_tensor(
        std, dtype=torch.float32
    ).flatten()


class SanaVideoAdapter(GemmaSanaAdapter):
    """Adapter over a loaded SanaVideoPipeline; the transformer is the trained module."""

    family = "sana_video"
    pipeline_cls = SanaVideoPipeline

    def __init__(self, pipeline: SanaVideoPipeline, policy: PolicyConfig, device: torch.device) -> None:
        super().__init__(pipeline, policy, device)
        self.frames = policy.diffusers.inference_frames
        self.temporal_factor, self.spatial_factor = vae_factors(self.vae)
        channels = self.transformer.config.in_channels
        self.latents_mean, self.latents_std = latent_stats(self.vae, channels)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mean, std shaped [1, C, 1, 1, 1] on `like`'s device and dtype."""
        view = (1, -1, 1, 1, 1)
        return (
            self.latents_mean.view(view).to(like.device, like.dtype),
            self.latents_std.view(view).to(like.device, like.dtype),
        )

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """clips [B, 3, T, H, W] in [0, 1] -> normalised latents [B, C, T', h, w] (float32)."""
        if images.ndim != 5:
            raise ValueError(f"SANA-Video encodes clips [B, 3, T, H, W]; got shape {tuple(images.shape)}")
        x = (2.0 * images - 1.0).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            out = self.vae.encode(x)
        z = out.latent_dist.mode() if hasattr(out, "latent_dist") else out.latent
        mean, std = self._stats(z.float())
        return (z.float() - mean) / std

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, C, T', h, w] -> clips [B, 3, T, H, W] in [0, 1]."""
        mean, std = self._stats(latents.float())
        z = (latents.float() * std + mean).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            x = self.vae.decode(z, return_dict=False)[0].float()
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)

    def latent_shape(self, height: int, width: int, frames: int | None = None) -> tuple[int, ...]:
        """Per-sample latent shape (C, T', h, w) of a clip of `frames` (default inference_frames) x height x width.

        Raises:
            ConfigError: when the frame count is not 1 + a multiple of the VAE's temporal factor, or the size is not
                divisible by its spatial factor times the transformer's patch.
        """
        frames = self.frames if frames is None else int(frames)
        ft, fs = self.temporal_factor, self.spatial_factor
        _, ph, pw = self.transformer.config.patch_size
        if frames < 1 or (frames - 1) % ft:
            raise ConfigError(
                f"{frames} frames do not fit this model's VAE (temporal factor {ft}): clips need 1 + {ft} k frames "
                f"(e.g. {1 + ft * max(1, (frames - 1) // ft)}); set `{FRAMES_KEY}` / `policy.diffusers."
                "train_frames` accordingly."
            )
        if height % (fs * ph) or width % (fs * pw):
            raise ConfigError(
                f"video size {height}x{width} is not divisible by {fs * ph}x{fs * pw} (VAE factor {fs} x patch "
                f"{ph}x{pw}); fix `policy.diffusers.inference_size`."
            )
        channels = self.transformer.config.in_channels
        return (channels, (frames - 1) // ft + 1, height // fs, width // fs)
