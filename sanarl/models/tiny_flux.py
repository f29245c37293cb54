"""Tiny random-init FLUX.1-dev pipeline (`sanarl-tiny:flux`) for tests of the FLUX path on CPU.

FLUX.1-dev's architecture, shrunk: a `FluxTransformer2DModel` (1 double-stream block, 1 single-stream block,
2 heads of 8, 3-axis RoPE (2, 2, 4), the guidance embedding of the guidance-distilled dev model), an `AutoencoderKL`
with 4 latent channels, spatial factor 4 and FLUX's latent shift / scale, a CLIP text encoder whose pooled output is
the pooled conditioning, a T5 encoder whose last hidden state is the token conditioning, and FLUX.1-dev's
flow-matching scheduler (dynamic, resolution-dependent shift: `base_shift` 0.5 at 256 image tokens, `max_shift` 1.15 at
4096). Both text slots use the word-level tokenizer over the shapes vocabulary, so the pipeline builds and loads
offline. The transformer sees 2 x 2 patches of the latent packed into tokens, so image sides are multiples of 8
(VAE factor 4 x packing 2), e.g. 32 x 32 -> 8 x 8 latents -> 16 image tokens of 16 features.
"""

from __future__ import annotations

import torch

from sanarl.models.tiny import SPECIAL_TOKENS
from sanarl.models.tiny_sd3 import CLIP_LENGTH, TEXT_WIDTH, _tokenizer, tiny_t5, tiny_vae

POOLED_WIDTH = 16
"""CLIP hidden width = transformer `pooled_projection_dim` (FLUX pools CLIP-L's 768-wide `pooler_output`)."""
LATENT_CHANNELS = 4
"""As the tiny SD3 VAE's (tiny_sd3.tiny_vae)."""
FLUX_LATENT_SCALE = (0.3611, 0.1159)
"""FLUX's VAE (scaling_factor, shift_factor)."""
PAD, BOS, EOS = (SPECIAL_TOKENS.index(t) for t in ("<pad>", "<bos>", "<eos>"))

FLUX_DEV_SCHEDULER = {
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
    "time_shift_type": "exponential",
}
"""FLUX.1-dev's scheduler config (its `shift` is unused while dynamic shifting is on)."""


def _clip(vocab_size: int):
    """CLIPTextModel: `pooler_output` at the first <eos>, POOLED_WIDTH features (no projection, as FLUX's CLIP-L)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=POOLED_WIDTH,
        intermediate_size=2 * POOLED_WIDTH,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=CLIP_LENGTH,
        hidden_act="gelu",
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    return CLIPTextModel(cfg)


def build_flux_pipeline(seed: int = 0):
    """The tiny FLUX.1-dev pipeline (random init from `seed`); `save_pretrained` it to load it like real weights."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    clip_tok = _tokenizer("<bos> $A <eos>", CLIP_LENGTH)
    vocab = len(clip_tok)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * LATENT_CHANNELS,  # a 2 x 2 patch of latents per token
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH,
        pooled_projection_dim=POOLED_WIDTH,
        guidance_embeds=True,
        axes_dims_rope=(2, 2, 4),
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER),
        vae=tiny_vae(*FLUX_LATENT_SCALE),
        text_encoder=_clip(vocab),
        tokenizer=clip_tok,
        text_encoder_2=tiny_t5(vocab),
        tokenizer_2=_tokenizer("$A <eos>", 512),
        transformer=transformer,
    )
