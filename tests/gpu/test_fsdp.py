"""FSDP2 through accelerate on the local GPUs (sanarl/data/accelerate/fsdp_8gpu.yaml, one process per GPU): SFT and
NFT train, ranks hold the same gathered weights, rank 0 writes one checkpoint layout, resume equals an
uninterrupted run, the export loads with diffusers. Skipped without CUDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch  # noqa: E402


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("fsdp")
    world = torch.cuda.device_count()
    args = [
        "--config_file",
        str(ROOT / "sanarl" / "data" / "accelerate" / "fsdp_8gpu.yaml"),
        "--num_processes",
        str(world),
    ]
    accelerate_launch(args, "ddp_fsdp.py", out, PYTHONPATH=str(ROOT / "tests" / "data"))
    return out, world


def test_fsdp_sft_and_nft_train_with_rank0_checkpoints_resume_and_export(launched):
    from fsdp_expectations import check_fsdp_launch

    check_fsdp_launch(*launched)
