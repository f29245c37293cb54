"""Stable Diffusion 3 / 3.5 adapter (diffusers `StableDiffusion3Pipeline`: MMDiT, AutoencoderKL, CLIP-L + CLIP-G + T5).

What `StableDiffusion3Pipeline.__call__` does, restated in sanarl's convention (docs/algorithms.md, "Conventions"):

- Prompts: `pipeline.encode_prompt` itself. Token embeddings [B, 77 + L, 4096] are the two CLIPs' penultimate hidden
  states concatenated on features (768 + 1280), zero-padded to T5's width and stacked on the sequence axis with T5's
  last hidden state of length L = `policy.diffusers.max_prompt_length` (the pipeline's `max_sequence_length`, the same
  value in training, rollout and eval); pooled [B, 2048] = the two CLIPs' projected end-of-text features. No mask:
  the MMDiT attends to the padding tokens, as in the pipeline.
- Model call: `transformer(x, encoder_hidden_states, pooled_projections, timestep=1000 * s)`; the pipeline's
  timesteps are the scheduler's sigmas times `num_train_timesteps = 1000` (floats) and its output is the velocity
  `eps - x0` of `x_s = (1 - s) x0 + s eps` (FlowMatchEulerDiscreteScheduler steps `x + v (s' - s)`).
- Latents: `z = (E(2x - 1) - shift_factor) * scaling_factor` and the inverse on decode, where E draws from the
  encoder's posterior `mean + std eps` as the references (training tasks pass eps from the step's seeded generator,
  so resume and micro-batch splits stay exact); without `noise`, or with `policy.diffusers.vae_latents = "mode"`,
  E is the posterior mean.
- Grid: the pipeline called without `sigmas` samples on `FlowMatchEulerDiscreteScheduler.set_timesteps(N)`, which
  spaces N levels between the ends of its already shifted training table and shifts them again (the base class's
  `pipeline_grid` "flow_match_euler", sanarl.core.flow.flow_match_euler_grid); shift = the scheduler's `shift`
  (3.0 for SD3.5). flow_grpo, DiffusionNFT and Sol-RL sample SD3.5 on the same grid.
- SD3.5-Medium vs SD3.5-Large (docs/sd35.md): the same pipeline class and adapter. Medium's MMDiT has dual-attention
  blocks (`dual_attention_layers` 0-12: a second, image-only attention `attn2` per block), Large has none (38 plain
  joint-attention blocks, width 2432); everything here reads the loaded config, never the block layout. Skip-layer
  guidance (the pipeline's `skip_guidance_layers`, which Medium's model card suggests as [7, 8, 9]) is off by default
  in the pipeline and is not applied by sanarl for either model: the sampler matches the pipeline's default call.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import StableDiffusion3Pipeline
from torch import nn

from sanarl.config.schema import PolicyConfig
from sanarl.models.base import Cond, DiffusionAdapter, posterior_latents
from sanarl.models.multi_encoder import (
    check_t5_prompt_length,
    load_multi_encoder_pipeline,
    present_text_encoders,
)

TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")


class SD3Adapter(DiffusionAdapter):
    """Adapter over a loaded StableDiffusion3Pipeline; the transformer (MMDiT) is the trained module."""

    family = "sd3"
    pipeline_cls = StableDiffusion3Pipeline
    default_lora_targets = (
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "attn.to_k",
        "attn.to_out.0",
        "attn.to_q",
        "attn.to_v",
    )
    """Joint-attention projections of both streams (image: to_*, text: add_*), as Cosmos-RL's and diffusers' SD3
    LoRA scripts target them (Sol-RL's SD3.5-Large list, configs/sol_rl/sd3.py, is the same); SD3.5-Medium's second
    (image-only) attention `attn2` is left alone."""

    def __init__(
        self, pipeline: StableDiffusion3Pipeline, policy: PolicyConfig, device: torch.device
    ) -> None:
        super().__init__()
        self._bind(pipeline, policy, device)
        self.latent_sampling = policy.diffusers.vae_latents == "sample"
        self.text_encoders = nn.ModuleList(present_text_encoders(pipeline, TEXT_ENCODERS))

    @classmethod
    def load(cls, directory: Path, policy: PolicyConfig, device: torch.device) -> SD3Adapter:
        """Load the pipeline from a local directory; frozen parts in `policy.diffusers.dtype`, the transformer in
        `transformer_dtype(policy)`, on `device` (text encoders and VAE stay on CPU with `offload`)."""
        recipes = "Cosmos-RL's SD3.5 recipes use 128 or 300, SOAR's uses 77"
        check_t5_prompt_length(policy, "SD3", recipes)
        pipe = load_multi_encoder_pipeline(StableDiffusion3Pipeline, directory, policy, device, TEXT_ENCODERS)
        return cls(pipe, policy, device)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """embeds [B, 77 + L, D_T5] and pooled [B, P] exactly as `StableDiffusion3Pipeline.encode_prompt`; mask None."""
        with self.resident(self.text_encoders):
            embeds, _, pooled, _ = self.pipeline.encode_prompt(
                prompt=list(prompts),
                prompt_2=None,
                prompt_3=None,
                device=self.device,
                do_classifier_free_guidance=False,
                max_sequence_length=self.max_prompt_length,
            )
        return Cond(embeds=embeds, mask=None, pooled=pooled)

    def _forward(self, module: nn.Module, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """MMDiT call: x [B, C, h, w], s [B] -> velocity [B, C, h, w] at the float timestep 1000 s."""
        dtype = next(self.transformer.parameters()).dtype
        return module(
            hidden_states=x.to(dtype),
            encoder_hidden_states=cond.embeds.to(dtype),
            pooled_projections=cond.pooled.to(dtype),
            timestep=self.model_time(s),
            return_dict=False,
        )[0]

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """images [B, 3, H, W] in [0, 1] -> z [B, C, H/f, W/f] = (E(2x - 1) - shift) * scale (float32); E is the
        posterior draw mean + std noise with `noise` [B, C, H/f, W/f] (when `latent_sampling`), else its mean."""
        cfg = self.vae.config
        x = (2.0 * images - 1.0).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            dist = self.vae.encode(x).latent_dist
        z = posterior_latents(dist, noise, self.latent_sampling)
        return (z - (cfg.shift_factor or 0.0)) * cfg.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """z [B, C, h, w] -> images [B, 3, f h, f w] in [0, 1] (the pipeline's decode, then (x + 1) / 2 clamped)."""
        cfg = self.vae.config
        z = (latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            x = self.vae.decode(z).sample.float()
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """(C, H / f, W / f); H and W must be multiples of f times the transformer's patch size (as the pipeline
        checks), else ValueError."""
        f = self.pipeline.vae_scale_factor
        step = f * self.transformer.config.patch_size
        if height % step or width % step:
            raise ValueError(
                f"image size {height}x{width} is not divisible by {step} (VAE factor {f} x patch size "
                f"{self.transformer.config.patch_size})"
            )
        return (self.transformer.config.in_channels, height // f, width // f)
