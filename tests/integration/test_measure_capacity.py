"""scripts/measure_capacity.py, the instrument behind docs/results.md's "Memory plan against measurement", run as the
docs run it, on the tiny SFT preset: a whole run measured on the CPU against the plan for CPU kernels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc (peak-RSS reset)")
@pytest.mark.parametrize("read", [[], ["--read-weights"]], ids=["as-run", "read-weights"])
def test_the_measured_peak_of_a_tiny_sft_run_is_within_ten_percent_of_the_plan(read):
    """As the run reads its weights, and with every weight read once at load (`--read-weights`)."""
    proc = subprocess.run(
        [sys.executable, "scripts/measure_capacity.py", *read, "--steps", "1", "--",
         "--config", "tiny-shapes-sft", "sanarl.datasets.shapes"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.search(
        r"measured ([\d.]+) MiB, estimated ([\d.]+) MiB \(training\), error ([+-][\d.]+)%", proc.stdout
    )
    assert found, proc.stdout
    measured, estimated, error = map(float, found.groups())
    assert measured > 100  # the tiny SFT run holds about 500 MiB at its peak
    assert abs(estimated / measured - 1) < 0.10
    assert abs(error - 100 * (estimated / measured - 1)) < 0.2


def test_the_micro_step_mode_refuses_a_full_fine_tune_by_name():
    proc = subprocess.run(
        [sys.executable, "scripts/measure_capacity.py", "--transformer", "--",
         "--config", "tiny-shapes-sft", "sanarl.datasets.shapes"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "policy.lora" in proc.stderr
