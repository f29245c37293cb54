"""Tiny random-init pipelines built from config: the embedded CPU model and the test models.

They are built once into the local cache (`$SANARL_CACHE/tiny/<name>-v<version>`), then loaded through the same
`from_pretrained` path real weights use. No network, milliseconds to build.

- `shapes`: the embedded default. SanaTransformer2DModel (6 layers, width 128, patch 4, sin-cos positions,
  ~1.8M params) diffusing in pixel space through the exactly invertible PixelAutoencoder, 32x32 px, with a frozen
  random-init Gemma-2 caption encoder (1 layer, width 64) and a word-level tokenizer over the shapes vocabulary.
- `sana-dcae`: the same family with a tiny learned-architecture DC-AE (random init), for tests of the real SANA path.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sanarl.config.presets import data_dir
from sanarl.errors import WeightsError
from sanarl.models.cache import cache_dir

TINY_VERSION = 2

SHAPES_VOCABULARY: tuple[str, ...] = tuple(
    """a an the and of to with on in at is are there photo image picture
    left right above below top bottom next beside under over side
    circle circles square squares triangle triangles shape shapes object objects
    red green blue yellow orange purple cyan magenta white gray black pink brown
    one two three four five six zero no single pair
    small large big""".split()
)
"""Words of the tiny tokenizer; anything else maps to <unk> (a test checks every shapes caption is covered)."""

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")


def word_tokenizer(words: tuple[str, ...] = SHAPES_VOCABULARY):
    """A lower-casing word-level fast tokenizer (works in any text-encoder slot)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def _gemma(vocab_size: int, hidden: int):
    from transformers import Gemma2Config, Gemma2Model

    cfg = Gemma2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        pad_token_id=0,
    )
    return Gemma2Model(cfg)


def sana_transformer(
    channels: int,
    heads: int,
    head_dim: int,
    layers: int,
    caption: int,
    patch: Any,
    cls: Any = None,
    **extra: Any,
) -> Any:
    """A SANA transformer (`cls`, default SanaTransformer2DModel; the video builders pass their 3D class) on an
    8 x 8 token grid whose self- and cross-attention share `heads` x `head_dim` (cross-attention width
    heads * head_dim), reading `caption`-wide text states; `extra` = more config keys."""
    if cls is None:
        from diffusers import SanaTransformer2DModel as cls

    return cls(
        in_channels=channels,
        out_channels=channels,
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        num_layers=layers,
        num_cross_attention_heads=heads,
        cross_attention_head_dim=head_dim,
        cross_attention_dim=heads * head_dim,
        caption_channels=caption,
        sample_size=8,
        patch_size=patch,
        **extra,
    )


def build_shapes_pipeline(seed: int = 0):
    """The embedded default model (pixel-space tiny SANA, 32x32)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaPipeline

    from sanarl.models.pixel_ae import PixelAutoencoder

    torch.manual_seed(seed)
    tokenizer = word_tokenizer()
    transformer = sana_transformer(
        3, heads=4, head_dim=32, layers=6, caption=64, patch=4, interpolation_scale=1
    )
    return SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=_gemma(len(tokenizer), 64),
        vae=PixelAutoencoder(in_channels=3, factor=1),
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
    )


def build_sana_dcae_pipeline(seed: int = 0):
    """Tiny SANA with a random-init DC-AE (factor 4, 4 latent channels) for tests of the real SANA path."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline

    torch.manual_seed(seed)
    tokenizer = word_tokenizer()
    vae = AutoencoderDC(
        in_channels=3,
        latent_channels=4,
        attention_head_dim=2,
        encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8, 8),
        decoder_block_out_channels=(8, 8, 8),
        encoder_layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1),
        encoder_qkv_multiscales=((), (), (5,)),
        decoder_qkv_multiscales=((), (), (5,)),
        scaling_factor=0.41,
    )
    transformer = sana_transformer(4, heads=2, head_dim=8, layers=2, caption=32, patch=1)
    return SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=_gemma(len(tokenizer), 32),
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )


TINY_BUILDERS: dict[str, Callable | str] = {
    "shapes": build_shapes_pipeline,
    "sana-dcae": build_sana_dcae_pipeline,
    "sd3": "sanarl.models.tiny_sd3:build_sd3_pipeline",
    "sd35l": "sanarl.models.tiny_sd3:build_sd35_large_pipeline",
    "flux": "sanarl.models.tiny_flux:build_flux_pipeline",
    "sana-video": "sanarl.models.tiny_video:build_sana_video_pipeline",
    "shapes-video": "sanarl.models.tiny_video:build_shapes_video_pipeline",
}
"""Tiny name -> builder `(seed=0) -> pipeline`, or "module:function" imported on first use (other families)."""


def _builder(name: str) -> Callable:
    entry = TINY_BUILDERS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry


SHIPPED_DIR = data_dir("models")
SHIPPED: dict[str, str] = {
    "shapes-base": "tiny-shapes-base",
    "video-base": "tiny-video-base",
}
"""Trained tiny pipelines shipped as package data in sanarl/data/models/ (fp16), by tiny name."""


def check_tiny_name(name: str) -> None:
    """Raise WeightsError (naming the known ones) when `name` is no tiny model."""
    if name not in SHIPPED and name not in TINY_BUILDERS:
        raise WeightsError(
            f"unknown tiny model `sanarl-tiny:{name}` in `policy.model_name_or_path`; known: "
            + ", ".join(f"sanarl-tiny:{k}" for k in [*TINY_BUILDERS, *SHIPPED])
        )


def ensure_tiny_pipeline(name: str) -> Path:
    """Directory of the tiny pipeline `name`: a shipped trained one, or a random-init one built into the cache."""
    if name in SHIPPED:
        path = SHIPPED_DIR / SHIPPED[name]
        if not (path / "model_index.json").is_file():
            raise WeightsError(
                f"the shipped model `sanarl-tiny:{name}` is missing at {path}; it ships inside the sanarl "
                "package (reinstall sanarl), or rebuild it with `python scripts/build_shapes_base.py "
                f"--model {name}`."
            )
        return path
    check_tiny_name(name)
    target = cache_dir() / "tiny" / f"{name}-v{TINY_VERSION}"
    if (target / "model_index.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        # the builders seed torch's global generator; keep the caller's stream as it was, so that the run that
        # builds the model on first use draws what every later run (which loads it) draws, e.g. its LoRA init
        with torch.random.fork_rng(devices=[]):
            _builder(name)().save_pretrained(str(staging))
        os.replace(staging, target)
    except OSError:
        if not (target / "model_index.json").is_file():  # a concurrent builder won the rename: fine
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
