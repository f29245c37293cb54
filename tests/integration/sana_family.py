"""The SANA family's oracle calls for the adapter contract, shared by SANA (test_adapter.py) and SANA-Video
(test_video_adapter.py): the pipeline's default call and its transformer called directly."""

from __future__ import annotations

import torch
from adapter_contract import LENGTH, STEPS

DEFAULT_TARGETS = "policy.lora.target_modules=[]"
"""LoRA presets: the family's default targets instead of SD3's."""


def pipeline_latents(pipe, prompts: list[str], guidance: float, generators, **video) -> torch.Tensor:
    """`SanaPipeline.__call__` (or `SanaVideoPipeline.__call__` with `frames`) with its defaults, but no complex
    human instruction (as the policy) and no resolution binning (sanarl samples the size it is given)."""
    out = pipe(
        prompt=prompts, num_inference_steps=STEPS, guidance_scale=guidance, height=32, width=32,
        max_sequence_length=LENGTH, complex_human_instruction=None, use_resolution_binning=False,
        generator=generators, output_type="latent", **video,
    )  # fmt: skip
    return out.frames if video else out.images


def direct_velocity(pipe, x, s, cond, guidance: float) -> torch.Tensor:
    """The transformer called directly at timestep 1000 s (times its `timestep_scale`) with the text mask."""
    scale = pipe.transformer.config.get("timestep_scale", 1.0)
    return pipe.transformer(
        x, encoder_hidden_states=cond.embeds, encoder_attention_mask=cond.mask, timestep=1000 * s * scale,
        return_dict=False,
    )[0]  # fmt: skip
