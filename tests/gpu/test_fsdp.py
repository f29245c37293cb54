"""FSDP2 through accelerate on the local GPUs (configs/accelerate/fsdp_8gpu.yaml, one process per GPU): SFT and
NFT train, ranks hold the same gathered weights, rank 0 writes one checkpoint layout, resume equals an
uninterrupted run, the export loads with diffusers. Skipped without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))


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
    from fsdp_expectations import check_fsdp_launch

    check_fsdp_launch(*launched)
