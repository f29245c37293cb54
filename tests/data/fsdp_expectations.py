"""What an FSDP2 launch of tests/data/ddp_fsdp.py must leave behind, on CPU processes (gloo) or GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

RUNS = ("sft3", "resumed4", "straight4", "nft")


def gathered(out: Path, name: str, rank: int = 0) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"{name}_rank{rank}.safetensors"))


def check_fsdp_launch(out: Path, world: int) -> None:
    """Ranks hold the same gathered weights; resume equals an uninterrupted run; rank 0 wrote one checkpoint
    layout of full tensors tagged FSDP; the SFT export loads in diffusers and holds the EMA weights; the NFT LoRA export exists."""
    from diffusers import SanaTransformer2DModel

    for name in RUNS:
        states = [gathered(out, name, r) for r in range(world)]
        assert all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in states[0]), name
    resumed, straight = gathered(out, "resumed4"), gathered(out, "straight4")
    assert all(torch.allclose(resumed[k], straight[k], atol=1e-6) for k in straight)
    ckpt = out / "a" / "checkpoints" / "step_00000003"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "ema.safetensors",
        "meta.json",
        "model.safetensors",
        "state.pt",
    ]
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["distributed_type"] == "FSDP" and meta["world_size"] == world
    saved, first = load_file(str(ckpt / "model.safetensors")), gathered(out, "sft3")
    assert set(saved) == set(first) and all(torch.equal(saved[k], first[k].cpu()) for k in saved)
    exported = SanaTransformer2DModel.from_pretrained(str(out / "b" / "export" / "transformer"))
    assert set(exported.state_dict()) == set(straight)
    ema = load_file(str(out / "b" / "checkpoints" / "step_00000004" / "ema.safetensors"))  # exports hold EMA
    assert ema and all(torch.equal(exported.state_dict()[k], ema[k]) for k in ema)
    assert (out / "nft" / "export" / "pytorch_lora_weights.safetensors").is_file()
