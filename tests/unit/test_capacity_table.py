"""docs/capacity.md is what `python -m sanarl.tools.capacity_table` prints: its header, one row per shipped preset,
and the rows regenerated now (one preset per model family and method kind) equal to the file's."""

from __future__ import annotations

from pathlib import Path

import pytest

from sanarl.config.presets import shipped_presets
from sanarl.tools.capacity_table import HEADER, row

DOC = Path(__file__).resolve().parents[2] / "docs" / "capacity.md"
REGENERATED = ["sana-image-nft-sol_rl", "sd35m-sft", "flux1-nft", "sana-video-sft-lora", "tiny-shapes-nft",
               "tiny-shapes-soar", "tiny-video-sft", "sd35m-grpo"]  # fmt: skip


def _rows() -> dict[str, str]:
    body = DOC.read_text().removeprefix(HEADER + "\n")
    return {
        line.split(" | ")[0].removeprefix("| "): line for line in body.splitlines() if line.startswith("| ")
    }


def test_the_file_has_the_header_and_a_row_for_every_shipped_preset():
    assert DOC.read_text().startswith(HEADER + "\n"), (
        "regenerate: python -m sanarl.tools.capacity_table > docs/capacity.md"
    )
    assert sorted(_rows()) == sorted(p.stem for p in shipped_presets())


@pytest.mark.slow
@pytest.mark.parametrize("preset", REGENERATED)
def test_regenerated_rows_equal_the_file(preset):
    assert row(preset) == _rows()[preset], (
        "regenerate: python -m sanarl.tools.capacity_table > docs/capacity.md"
    )
