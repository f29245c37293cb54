"""FLUX.1 adapter (diffusers `FluxPipeline`: double- and single-stream MMDiT, AutoencoderKL, CLIP-L + T5).

What `FluxPipeline.__call__` does, restated in sanarl's convention (docs/algorithms.md, "Conventions"; docs/flux.md):

- Latents: sanarl keeps the VAE's latent grid z [B, C, h, w] (h = H / f), as for every family; the adapter packs
  each 2 x 2 patch of it into one token, [B, (h/2)(w/2), 4C] (channel-major inside a token, patches row-major), just
  before the transformer and unpacks the output the same way. Packing is a permutation, so seeded noise drawn on the
  grid is the pipeline's packed noise and the Euler step commutes with it.
- Position ids: image token (i, j) has id (0, i, j), text tokens all (0, 0, 0); the transformer's 3-axis RoPE reads
  them. Both are rebuilt from the shapes of each call.
- Prompts: `pipeline.encode_prompt` itself: embeds [B, L, D] = T5's last hidden state of L =
  `policy.diffusers.max_prompt_length` tokens (the pipeline's `max_sequence_length`), pooled [B, P] = CLIP's
  `pooler_output`. No mask: the transformer attends to the padding tokens, as in the pipeline.
- Guidance: FLUX.1-dev is guidance-distilled. `sample.guidance_scale` is the pipeline's `guidance_scale`, fed to the
  transformer's guidance embedding (times 1000 inside it); there is no CFG batch and no unconditional prompt, so
  `guided_velocity` is one forward at that guidance. Plain `velocity` (training forwards) uses the configured
  `policy.diffusers.sample.guidance_scale`, as Sol-RL's FLUX trainer uses its train guidance.
- Model call: `transformer(packed, timestep=s, guidance=g, ...)`; the pipeline passes `t / 1000` with t = 1000 s,
  i.e. s itself, and its output is the velocity `eps - x0` of `x_s = (1 - s) x0 + s eps`.
- Grid: the pipeline passes `sigmas = linspace(1, 1/N, N)` to its scheduler (sanarl's `linspace` grid, unlike
  SD3.5's and SANA's pipelines, which sample on their scheduler's own `set_timesteps(N)` grid).
- Grid shift by resolution: with dynamic shifting the pipeline sets mu = linear in the image token count
  (`base_shift` at `base_image_seq_len` up to `max_shift` at `max_image_seq_len`) and shifts the grid by
  exp(mu) t / (1 + (exp(mu) - 1) t), which is sanarl's shift map with shift = exp(mu) (`shift_for`).
- Latent normalisation: `z = (E(2x - 1) - shift_factor) * scaling_factor` and its inverse on decode, where E draws
  from the encoder's posterior `mean + std eps` for training (SFT, SOAR), as diffusers' FLUX training scripts take
  `latent_dist.sample()` (eps from the step's seeded generator); `policy.diffusers.vae_latents = "mode"`, or no
  noise, takes the posterior mean.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from diffusers import FluxPipeline
from torch import nn

from sanarl.config.schema import PolicyConfig
from sanarl.models.base import Cond, DiffusionAdapter, posterior_latents
from sanarl.models.multi_encoder import check_t5_prompt_length, load_multi_encoder_pipeline

TEXT_ENCODERS = ("text_encoder", "text_encoder_2")


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, (h/2)(w/2), 4C]: token (i, j) holds the 2 x 2 patch at rows 2i.., columns 2j.., its
    features ordered (channel, row in patch, column in patch)."""
    b, c, h, w = latents.shape
    patches = latents.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // 2) * (w // 2), 4 * c)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of `pack` for a latent grid of height x width."""
    b, _, features = tokens.shape
    c = features // 4
    patches = tokens.reshape(b, height // 2, width // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(b, c, height, width)


def image_ids(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """[rows * cols, 3] position ids (0, i, j) of the packed image tokens, row-major."""
    i, j = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    ids = torch.stack([torch.zeros_like(i), i, j], dim=-1).reshape(rows * cols, 3)
    return ids.to(device=device, dtype=torch.float32)


def resolution_shift(scheduler_config, tokens: int) -> float | None:
    """The grid shift FluxPipeline applies for `tokens` image tokens, or None without dynamic shifting."""
    cfg = scheduler_config
    if not cfg.get("use_dynamic_shifting", False):
        return None
    lo, hi = cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096)
    base, top = cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15)
    mu = base + (top - base) * (tokens - lo) / (hi - lo)
    # the scheduler's time shift at sigma = 1: exp(mu) (exponential) or mu (linear) as the shift of t / (1 - t)
    return math.exp(mu) if cfg.get("time_shift_type", "exponential") == "exponential" else mu


class FluxAdapter(DiffusionAdapter):
    """Adapter over a loaded FluxPipeline; the transformer is the trained module."""

    family = "flux"
    pipeline_cls = FluxPipeline
    cfg_batch = False
    default_lora_targets = ("to_k", "to_q", "to_v", "to_out.0")
    """Sol-RL's FLUX.1 targets (configs/sol_rl/flux1.py): the attention projections of the double-stream blocks
    (image stream; to_out.0 exists only there) and the q / k / v of the single-stream blocks."""

    def __init__(self, pipeline: FluxPipeline, policy: PolicyConfig, device: torch.device) -> None:
        super().__init__()
        self._bind(pipeline, policy, device)
        self.pipeline_grid = (
            "linspace"  # FluxPipeline passes sigmas = linspace(1, 1/N, N), shifted by exp(mu)
        )
        self.text_encoders = nn.ModuleList([getattr(pipeline, n) for n in TEXT_ENCODERS])
        self.latent_sampling = policy.diffusers.vae_latents == "sample"
        self.guidance = float(policy.diffusers.sample.guidance_scale)
        self.guidance_embeds = bool(pipeline.transformer.config.guidance_embeds)
        default_size = pipeline.default_sample_size * pipeline.vae_scale_factor
        self.default_shift = self.shift_for(default_size, default_size)

    @classmethod
    def load(cls, directory: Path, policy: PolicyConfig, device: torch.device) -> FluxAdapter:
        """Load the pipeline from a local directory; frozen parts in `policy.diffusers.dtype`, the transformer in
        `transformer_dtype(policy)`, on `device` (text encoders and VAE stay on CPU with `offload`)."""
        check_t5_prompt_length(policy, "FLUX", "Sol-RL's FLUX.1 recipes use 128")
        pipe = load_multi_encoder_pipeline(FluxPipeline, directory, policy, device, TEXT_ENCODERS)
        return cls(pipe, policy, device)

    def shift_for(self, height: int, width: int) -> float:
        """exp(mu) of the pipeline's `calculate_shift` for the packed token count of a height x width image."""
        step = 2 * self.pipeline.vae_scale_factor
        shift = resolution_shift(self.pipeline.scheduler.config, (height // step) * (width // step))
        return self.default_shift if shift is None else shift

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """embeds [B, L, D_T5] and pooled [B, P] exactly as `FluxPipeline.encode_prompt`; mask None."""
        with self.resident(self.text_encoders):
            embeds, pooled, _ = self.pipeline.encode_prompt(
                prompt=list(prompts),
                prompt_2=None,
                device=self.device,
                max_sequence_length=self.max_prompt_length,
            )
        return Cond(embeds=embeds, mask=None, pooled=pooled)

    def _forward(self, module: nn.Module, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """`velocity`'s call: at the configured embedded guidance (`sample.guidance_scale`); `guided_velocity`
        calls `_embedded_forward` at its own scale (one forward, no CFG batch)."""
        return self._embedded_forward(module, x, s, cond, self.guidance)

    def _embedded_forward(
        self, module: nn.Module, x: torch.Tensor, s: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Pack x [B, C, h, w], run the transformer at timestep s with the position ids, unpack the velocity."""
        dtype = next(self.transformer.parameters()).dtype
        batch, _, height, width = x.shape
        g = torch.full((batch,), guidance, device=x.device) if self.guidance_embeds else None
        out = module(
            hidden_states=pack(x).to(dtype),
            timestep=(self.model_time(s) / 1000.0 if self.integer_timesteps else s).to(dtype),
            guidance=g,
            pooled_projections=cond.pooled.to(dtype),
            encoder_hidden_states=cond.embeds.to(dtype),
            txt_ids=torch.zeros(cond.embeds.shape[1], 3, device=x.device),
            img_ids=image_ids(height // 2, width // 2, x.device),
            return_dict=False,
        )[0]
        return unpack(out, height, width)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """images [B, 3, H, W] in [0, 1] -> z [B, C, H/f, W/f] = (E(2x - 1) - shift) * scale (float32); E is the
        posterior draw mean + std noise with `noise` (when `latent_sampling`, as diffusers' FLUX training scripts
        sample), else its mean."""
        cfg = self.vae.config
        x = (2.0 * images - 1.0).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            dist = self.vae.encode(x).latent_dist
        return (posterior_latents(dist, noise, self.latent_sampling) - cfg.shift_factor) * cfg.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """z [B, C, h, w] -> images [B, 3, f h, f w] in [0, 1] (the pipeline's decode, then (x + 1) / 2 clamped)."""
        cfg = self.vae.config
        z = (latents / cfg.scaling_factor + cfg.shift_factor).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            x = self.vae.decode(z).sample.float()
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """(C, H / f, W / f); H and W must be multiples of 2 f (VAE factor x 2 x 2 packing), else ValueError."""
        f = self.pipeline.vae_scale_factor
        if height % (2 * f) or width % (2 * f):
            raise ValueError(
                f"image size {height}x{width} is not divisible by {2 * f} (VAE factor {f} x 2 x 2 packing)"
            )
        return (self.transformer.config.in_channels // 4, height // f, width // f)
