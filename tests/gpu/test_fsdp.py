"""FSDP2 through accelerate on the local GPUs (configs/accelerate/fsdp_8gpu.yaml, one process per GPU): SFT and
NFT train, ranks hold the same gathered weights, rank 0 writes one checkpoint layout, resume equals an
uninterrupted run, the export loads with diffusers. Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("fsdp")
    world = torch.cuda.device_count()
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "configs" / "accelerate" / "fsdp_8gpu.yaml"), "--num_processes", str(world),
        str(ROOT / "tests" / "data" / "ddp_fsdp.py"), str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "tests" / "data")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, world


def test_fsdp_sft_and_nft_train_with_rank0_checkpoints_resume_and_export(launched):
    out, world = launched
    for name in ("sft3", "resumed4", "straight4", "nft"):
        states = [load_file(str(out / f"{name}_rank{r}.safetensors")) for r in range(world)]
        assert all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in states[0]), name
    resumed, straight = (load_file(str(out / f"{n}_rank0.safetensors")) for n in ("resumed4", "straight4"))
    assert all(torch.allclose(resumed[k], straight[k], atol=1e-6) for k in straight)
    ckpt = out / "a" / "checkpoints" / "step_00000003"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "ema.safetensors",
        "meta.json",
        "model.safetensors",
        "state.pt",
    ]
    assert json.loads((ckpt / "meta.json").read_text())["distributed_type"] == "FSDP"
    saved = load_file(str(ckpt / "model.safetensors"))
    first = load_file(str(out / "sft3_rank0.safetensors"))
    assert all(torch.equal(saved[k], first[k].cpu()) for k in saved)
    from diffusers import SanaTransformer2DModel

    exported = SanaTransformer2DModel.from_pretrained(str(out / "b" / "export" / "transformer"))
    assert set(exported.state_dict()) == set(straight)
    assert (out / "nft" / "export" / "pytorch_lora_weights.safetensors").is_file()
