"""Parts of a run that the runner calls at fixed points of its loop (as TRL's callbacks, torchtitan's components).

The runner owns the steps and composes the trained state, checkpoints (run_folder/run_checkpoints.py) and validations
(validation.py); a component adds behaviour at these points, in the order `component_set.build_components` lists
them, each hook on every rank unless it says otherwise:

    on_step(step, metrics)             after each optimizer step's metrics are logged
    validation_metrics(images)         extra metrics of a validation's samples (rank 0), logged with them
    observe(step, images, prompts, m)  the validation's samples and what was logged of them (rank 0)
    after_validation(step, logger)     once a validation is logged; True asks the run to stop there
    checkpoint_state() / restore()     its state in every checkpoint (rank 0), as `<name>.pt`; read back at resume
    before_export(stopped) / after_export(stopped, export_dir)   around the final export

A component whose checkpointed state includes a validation (`saves_after_validation`) makes the runner write a
step's checkpoint after that step's validation rather than before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator
    from rich.console import Console

    from sanarl.training.tracking import MetricsLogger


class RunHandle(Protocol):
    """What a component may use of the run: the accelerator, the console, the whole weights (every rank takes
    part) and loading weights back (model and EMA)."""

    acc: Accelerator
    console: Console

    def full_state(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict]: ...

    def load_weights(self, tensors: dict[str, dict[str, torch.Tensor]]) -> None: ...


class RunComponent:
    """A component with every hook doing nothing; subclasses override what they need."""

    name = ""
    """Its checkpoint file's stem (`<name>.pt`)."""
    saves_after_validation = False

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        return None

    def validation_metrics(self, images: torch.Tensor) -> dict[str, float]:
        return {}

    def observe(self, step: int, images: torch.Tensor, prompts: list[str], logged: dict[str, float]) -> None:
        return None

    def after_validation(self, step: int, logger: MetricsLogger) -> bool:
        return False

    def checkpoint_state(self) -> Any | None:
        return None

    def restore(self, path: Path, step: int) -> None:
        return None

    def before_export(self, stopped: bool) -> None:
        return None

    def after_export(self, stopped: bool, export_dir: Path | None) -> None:
        return None
