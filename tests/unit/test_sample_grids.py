"""Sample grids (`samples/step_NNNNNNNN.png`, the guard's alarm grids, `sanarl eval`'s grid) are written like the
run's other files: to a temporary file renamed over the name, never through a planted link."""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image

from sanarl.core.images import save_grid


def test_a_grid_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    path = tmp_path / "samples" / "step_00000002.png"
    path.parent.mkdir()
    path.symlink_to(victim)
    images = torch.zeros(2, 3, 8, 8)
    images[1, 0] = 1.0  # the second tile red
    save_grid(images, ["black", "red"], path, columns=2, tile=16)
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink()
    with Image.open(path) as grid:
        assert grid.format == "PNG"
        pixels = np.asarray(grid.convert("RGB"))
    reds = (pixels == np.array([255, 0, 0], dtype=np.uint8)).all(axis=-1).sum()
    assert reds == 16 * 16  # the red tile, upscaled to 16 x 16, whole
    assert [p.name for p in path.parent.iterdir()] == ["step_00000002.png"]  # no temporary file left
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
