"""The GPU check script on a real CUDA GPU: every check passes (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_gpu_check_passes_every_check(capsys):
    from sanarl.tools import gpu_check

    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count("PASS") >= 5  # sft, compile, nft, soar, sol_rl
