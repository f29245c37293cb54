"""Atomic checkpoints with rotation, and resume-path resolution.

Layout of one checkpoint `<output_dir>/checkpoints/step_00000100/`:
  `<group>.safetensors`  named tensor groups (trainable weights, LoRA adapters, EMA shadow)
  `state.pt`             torch-serialised optimizer / LR-scheduler state (weights_only loadable)
  `meta.json`            step, data position and anything JSON-able the runner needs
  `<name>.pt`            extra torch-serialised state, weights_only loadable (`guard.pt`: the reward-hacking
                         guard's history, sanarl/training/guard.py)
A checkpoint is written into a hidden staging directory and renamed into place, so a kill mid-save never leaves a
half-written checkpoint that resume would pick up.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sanarl.errors import UserError

PREFIX = "step_"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def save_checkpoint(
    root: Path,
    step: int,
    tensors: dict[str, dict[str, torch.Tensor]],
    torch_state: dict[str, Any],
    meta: dict[str, Any],
    max_keep: int = 0,
    extras: Mapping[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically (with `extras[name]` as `<name>.pt`) and delete the oldest beyond
    `max_keep` (0 = keep all)."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / checkpoint_name(step)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        for group, named in tensors.items():
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in named.items()},
                str(staging / f"{group}.safetensors"),
            )
        torch.save(torch_state, staging / "state.pt")
        for name, obj in (extras or {}).items():
            torch.save(obj, staging / f"{name}.pt")
        (staging / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if max_keep > 0:
        for old in list_checkpoints(root)[:-max_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(path: Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any], dict[str, Any]]:
    """(tensor groups, torch state, meta) of a checkpoint directory."""
    tensors = {p.stem: load_file(str(p)) for p in sorted(path.glob("*.safetensors"))}
    torch_state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    meta = json.loads((path / "meta.json").read_text())
    return tensors, torch_state, meta


def load_extra(path: Path, name: str) -> Any | None:
    """The extra state `name` a checkpoint directory holds (`<name>.pt`), or None when it holds none.

    Raises:
        UserError: the file is there but unreadable (naming it and the fix).
    """
    file = path / f"{name}.pt"
    if not file.is_file():
        return None
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (truncated, foreign or not a torch file: all the same to the user)
        raise UserError(
            f"{file} is not a readable checkpoint file ({type(err).__name__}); delete it to resume without "
            f"its state ({name} starts afresh), or resume from another checkpoint with train.resume = <path>."
        ) from err


def resolve_resume(resume: bool | str, checkpoints_root: Path) -> Path | None:
    """The checkpoint `train.resume` designates, or None to start fresh.

    true: the newest checkpoint under `checkpoints_root` (None if there is none yet: a first run of a resumable
    preset starts fresh). A path: that checkpoint directory, or the newest inside a run / checkpoints directory.
    Raises ValueError with the fix when a given path holds no checkpoint.
    """
    if resume is False or resume == "":
        return None
    if resume is True:
        found = list_checkpoints(checkpoints_root)
        return found[-1] if found else None
    path = Path(str(resume)).expanduser()
    if (path / "meta.json").is_file():
        return path
    for candidate in (path, path / "checkpoints"):
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    raise ValueError(
        f'`train.resume = "{resume}"` holds no checkpoint (expected a `{PREFIX}NNNNNNNN` directory with meta.json, '
        "or a run directory containing checkpoints/); set `train.resume = true` to resume from this run's "
        "output_dir, or `false` to start fresh."
    )
