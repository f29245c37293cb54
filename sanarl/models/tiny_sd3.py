"""Tiny random-init Stable Diffusion 3.5 pipelines (`sanarl-tiny:sd3`, Medium-shaped; `sanarl-tiny:sd35l`,
Large-shaped) for tests of the SD3 path on CPU.

The same architecture as SD3.5-Medium, shrunk: an MMDiT (`SD3Transformer2DModel`, 2 joint blocks, the first with
SD3.5's dual attention, RMS q/k norm, patch 2), an `AutoencoderKL` with 4 latent channels, spatial factor 4 and
SD3's latent shift / scale, two CLIP text encoders with projection (the "L" and "G" slots, pooled outputs
concatenated) and a T5 encoder, and SD3.5's flow-matching scheduler (shift 3). Every text slot uses a word-level
fast tokenizer over the shapes vocabulary, so the pipeline builds and loads offline. Images of any size whose sides
are multiples of 8 (VAE factor 4 x patch 2) up to 64 x 64 latents (256 px), e.g. 32 x 32 or 64 x 96.

Widths: CLIP hidden 16 each (their concatenation, 32, is the T5 width, as in SD3 where CLIP-L + CLIP-G = 768 + 1280
is zero-padded to T5's 4096), projections 16 + 16 = pooled width 32.
"""

from __future__ import annotations

import torch

from sanarl.models.tiny import SHAPES_VOCABULARY, SPECIAL_TOKENS, word_tokenizer

CLIP_LENGTH = 16
"""Token budget of the tiny CLIP slots (SD3's real CLIP tokenizers use 77)."""
TEXT_WIDTH = 32
"""T5 width = transformer `joint_attention_dim` = CLIP-L + CLIP-G hidden widths."""
PAD, UNK, BOS, EOS = (SPECIAL_TOKENS.index(t) for t in ("<pad>", "<unk>", "<bos>", "<eos>"))


def _tokenizer(template: str, max_length: int):
    """The shapes word tokenizer with a post-processor `template` (e.g. "<bos> $A <eos>") and a token budget."""
    from tokenizers.processors import TemplateProcessing

    tok = word_tokenizer(SHAPES_VOCABULARY)
    specials = [(t, SPECIAL_TOKENS.index(t)) for t in ("<bos>", "<eos>") if t in template]
    tok.backend_tokenizer.post_processor = TemplateProcessing(single=template, special_tokens=specials)
    tok.model_max_length = max_length
    return tok


def _clip(vocab_size: int, hidden: int):
    """CLIPTextModelWithProjection: pooled output at the first <eos>, projected to `hidden` features."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        projection_dim=hidden,
        num_hidden_layers=2,  # SD3 reads hidden_states[-2]: with 2 layers that is the first layer's output
        num_attention_heads=2,
        max_position_embeddings=CLIP_LENGTH,
        hidden_act="gelu",
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    return CLIPTextModelWithProjection(cfg)


def tiny_t5(vocab_size: int):
    """One-layer T5 encoder of TEXT_WIDTH features (the token conditioning of SD3 and FLUX)."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        vocab_size=vocab_size,
        d_model=TEXT_WIDTH,
        d_kv=8,
        d_ff=2 * TEXT_WIDTH,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    return T5EncoderModel(cfg)


SD3_LATENT_SCALE = (1.5305, 0.0609)
"""SD3's VAE (scaling_factor, shift_factor)."""


def tiny_vae(scaling_factor: float, shift_factor: float):
    """AutoencoderKL, factor 4 (3 blocks), 4 latent channels, with the family's scaling / shift factors."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def build_sd3_pipeline(seed: int = 0, *, dual_attention_layers: tuple[int, ...] = (0,)):
    """The tiny SD3.5 pipeline (random init from `seed`); `save_pretrained` it to load it like real weights.
    `dual_attention_layers`: the MMDiT blocks with SD3.5-Medium's second, image-only attention (`attn2`)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    clip_tok = _tokenizer("<bos> $A <eos>", CLIP_LENGTH)
    vocab = len(clip_tok)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH,
        caption_projection_dim=16,
        pooled_projection_dim=TEXT_WIDTH,
        pos_embed_max_size=32,
        dual_attention_layers=dual_attention_layers,
        qk_norm="rms_norm",
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny_vae(*SD3_LATENT_SCALE),
        text_encoder=_clip(vocab, TEXT_WIDTH // 2),
        tokenizer=clip_tok,
        text_encoder_2=_clip(vocab, TEXT_WIDTH // 2),
        tokenizer_2=_tokenizer("<bos> $A <eos>", CLIP_LENGTH),
        text_encoder_3=tiny_t5(vocab),
        tokenizer_3=_tokenizer("$A <eos>", 512),
    )


def build_sd35_large_pipeline(seed: int = 0):
    """The tiny SD3.5-Large-shaped pipeline (`sanarl-tiny:sd35l`): what differs from Medium at this scale is the
    MMDiT without dual-attention blocks (SD3.5-Large's `dual_attention_layers` is empty: one joint attention per
    block, no `attn2`); text encoders, VAE, q/k RMS norm and the shift-3 scheduler are Medium's."""
    return build_sd3_pipeline(seed, dual_attention_layers=())
