"""SANA / SANA 1.5 image adapter (diffusers `SanaPipeline`: SanaTransformer2DModel, DC-AE, Gemma-2).

Prompts: `SanaPipeline.encode_prompt` with `complex_human_instruction` = the pipeline's own default instruction (the
lines `SanaPipeline.__call__` prepends) when `policy.diffusers.complex_human_instruction` is on, else none; the
empty prompt of CFG's unconditional branch never has it, as the pipeline encodes its negative prompt.

Latents: `z = vae.encode(2x - 1).latent * scaling_factor` (DC-AE, or sanarl's pixel-space PixelAutoencoder for the
tiny CPU model). The transformer is called with the float timestep `1000 * s * timestep_scale` and the text mask as
`encoder_attention_mask`, exactly as `SanaPipeline.__call__` does.
"""

from __future__ import annotations

import inspect

import torch
from diffusers import SanaPipeline
from torch import nn

from sanarl.config.schema import PolicyConfig
from sanarl.models import pixel_ae  # noqa: F401  (diffusers loads the tiny models' VAE by this module name)
from sanarl.models.base import Cond, DiffusionAdapter

SANA_LORA_TARGETS = (
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
)
"""Self- and cross-attention projections of SANA (and SANA-Video) blocks, diffusers names (Cosmos-RL's targets)."""


def pipeline_instruction(pipeline_cls: type = SanaPipeline) -> list[str] | None:
    """The complex human instruction `pipeline_cls.__call__` prepends by default (its signature default): diffusers
    joins the lines with newlines, prepends them to every prompt and lengthens the token budget by their tokens."""
    return inspect.signature(pipeline_cls.__call__).parameters["complex_human_instruction"].default


class GemmaSanaAdapter(DiffusionAdapter):
    """What SANA and SANA-Video share: Gemma-2 prompts through the pipeline's own `encode_prompt` (with its complex
    human instruction when `complex_human_instruction` is on) and the transformer called with the text mask as
    `encoder_attention_mask`; a subclass sets `pipeline_cls` and, where its pipeline scales it, `_timestep`."""

    default_lora_targets = SANA_LORA_TARGETS

    def __init__(self, pipeline: SanaPipeline, policy: PolicyConfig, device: torch.device) -> None:
        super().__init__()
        self._bind(pipeline, policy, device)
        self.text_encoder = pipeline.text_encoder
        on = policy.diffusers.complex_human_instruction
        self.instruction = pipeline_instruction(self.pipeline_cls) if on else None

    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Gemma-2 hidden states [B, L, D] and mask [B, L], as the pipeline's `encode_prompt` computes them (with the
        pipeline's complex human instruction when `complex_human_instruction` is on)."""
        return self._gemma(prompts, self.instruction)

    def encode_negative_prompts(self, prompts: list[str]) -> Cond:
        """As the pipeline encodes its negative prompt: never with the complex human instruction."""
        return self._gemma(prompts, None)

    @torch.no_grad()
    def _gemma(self, prompts: list[str], instruction: list[str] | None) -> Cond:
        with self.resident(self.text_encoder):
            embeds, mask, _, _ = self.pipeline.encode_prompt(
                list(prompts),
                do_classifier_free_guidance=False,
                device=self.device,
                max_sequence_length=self.max_prompt_length,
                complex_human_instruction=instruction,
            )
        return Cond(embeds=embeds, mask=mask)

    def _timestep(self, s: torch.Tensor) -> torch.Tensor:
        """The model timestep of levels s: 1000 s (`model_time`)."""
        return self.model_time(s)

    def _forward(self, module: nn.Module, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        dtype = next(self.transformer.parameters()).dtype
        out = module(
            x.to(dtype),
            encoder_hidden_states=cond.embeds.to(dtype),
            encoder_attention_mask=cond.mask,
            timestep=self._timestep(s),
            return_dict=False,
        )[0]
        if self.transformer.config.out_channels // 2 == self.transformer.config.in_channels:
            out = out.chunk(2, dim=1)[0]  # learned-sigma heads: keep the velocity half
        return out


class SanaAdapter(GemmaSanaAdapter):
    """Adapter over a loaded SanaPipeline; the transformer is the trained module."""

    family = "sana"
    pipeline_cls = SanaPipeline

    def _timestep(self, s: torch.Tensor) -> torch.Tensor:
        """1000 s times the transformer's `timestep_scale`, as `SanaPipeline.__call__` passes it."""
        return self.model_time(s) * self.transformer.config.timestep_scale

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        x = (2.0 * images - 1.0).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            return self.vae.encode(x).latent.float() * self.vae.config.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        z = (latents / self.vae.config.scaling_factor).to(self.device, self.vae.dtype)
        with self.resident(self.vae):
            x = self.vae.decode(z).sample.float()
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        f = self.pipeline.vae_scale_factor
        if height % f or width % f:
            raise ValueError(f"image size {height}x{width} is not divisible by the VAE factor {f}")
        return (self.transformer.config.in_channels, height // f, width // f)
