"""Loading shared by the families conditioned by several frozen text encoders, one of them T5 (SD3, FLUX.1).

Both read the transformer straight into `transformer_dtype(policy)` (float32 master weights need no round trip
through the frozen dtype) and every other part in `policy.diffusers.dtype`; the VAE and the text encoders are frozen
and in eval mode, and stay on CPU with `policy.diffusers.offload`. The T5 prompt budget is checked before any weight
is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sanarl.config.schema import PolicyConfig
from sanarl.errors import ConfigError
from sanarl.models.base import DTYPES, transformer_dtype

T5_LIMIT = 512
"""Longest `max_sequence_length` the SD3 and FLUX pipelines accept."""


def check_t5_prompt_length(policy: PolicyConfig, family: str, recipes: str) -> None:
    """ConfigError unless `policy.diffusers.max_prompt_length` is 1 to T5_LIMIT; `recipes` says what they use."""
    length = policy.diffusers.max_prompt_length
    if not 1 <= length <= T5_LIMIT:
        raise ConfigError(
            f"`policy.diffusers.max_prompt_length = {length}`: {family}'s T5 encoder takes 1 to {T5_LIMIT} tokens; "
            f"set it in that range ({recipes})."
        )


def present_text_encoders(pipeline: Any, names: Sequence[str]) -> list[nn.Module]:
    """The pipeline's text encoders among `names`, skipping those it was loaded without (None)."""
    return [getattr(pipeline, n) for n in names if getattr(pipeline, n) is not None]


def load_multi_encoder_pipeline(
    pipeline_cls: type,
    directory: Path,
    policy: PolicyConfig,
    device: torch.device,
    text_encoders: Sequence[str],
) -> Any:
    """`pipeline_cls.from_pretrained(directory)` with the dtypes, devices and frozen parts of the module doc."""
    dtypes = {"default": DTYPES[policy.diffusers.dtype], "transformer": transformer_dtype(policy)}
    pipe = pipeline_cls.from_pretrained(str(directory), dtype=dtypes)
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.to(device)
    for module in (pipe.vae, *present_text_encoders(pipe, text_encoders)):
        module.requires_grad_(False).eval()
        if not policy.diffusers.offload:
            module.to(device)
    return pipe
