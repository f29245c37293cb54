"""The reward-hacking guard (sanarl/training/guard.py) as a run component (sanarl/training/component_hooks.py).

At each validation rank 0's guard reads the samples' held-out rewards and image statistics; its decision (keep a
checkpoint of a guard metric's new best, stop on an `action = "stop"` alarm) is shared with every rank. Its
history goes into every checkpoint (`guard.pt`), written after the step's validation so a resumed run never
repeats one; a stopped run exports the rollback step's weights (`validation.guard.rollback`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sanarl.config.schema import Config, ValidationConfig
from sanarl.training.component_hooks import RunComponent, RunHandle
from sanarl.training.guard import Guard, check_reward_keys
from sanarl.training.run_folder.checkpoint_store import load_checkpoint, load_extra
from sanarl.training.tracking import MetricsLogger


class GuardComponent(RunComponent):
    name = "guard"
    saves_after_validation = True
    """A step's checkpoint holds the guard's history through that step's validation."""

    def __init__(self, cfg: ValidationConfig, run: RunHandle, run_dir: Path, held_out_rewards) -> None:
        """Builds the held-out rewards now (rank 0), so that a guard key no reward returns stops the run before
        training."""
        self.cfg, self.run = cfg.guard, run
        if cfg.held_out_rewards and run.acc.is_main_process:  # rank 0 scores the validations
            check_reward_keys(cfg.guard, held_out_rewards())
        self.guard = Guard(cfg.guard, run_dir)
        self.rolled_back: Path | None = None

    @classmethod
    def build(cls, cfg: Config, run: RunHandle, run_dir: Path, held_out_rewards) -> GuardComponent | None:
        val = cfg.validation
        return cls(val, run, run_dir, held_out_rewards) if val.enable and val.guard.enable else None

    # --- the loop ---------------------------------------------------------------------------------------------
    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.guard.record_step(step, metrics)

    def validation_metrics(self, images: torch.Tensor) -> dict[str, float]:
        return self.guard.image_metrics(images)

    def observe(self, step: int, images: torch.Tensor, prompts: list[str], logged: dict[str, float]) -> None:
        self.guard.observe(step, images, prompts, logged)

    def after_validation(self, step: int, logger: MetricsLogger) -> bool:
        """Rank 0's decision on the validation at `step`, on every rank: keep a checkpoint of this step (every
        rank gathers) and whether to stop."""
        acc = self.run.acc
        keep, stop = self.guard.decide(step, logger) if acc.is_main_process else (False, False)
        flags = torch.tensor([float(keep), float(stop)], device=acc.device)
        if acc.num_processes > 1:
            torch.distributed.broadcast(flags, src=0)
        if flags[0] > 0:
            tensors, _ = self.run.full_state()
            if acc.is_main_process:
                self.guard.keep_checkpoint(step, tensors)
            acc.wait_for_everyone()
        alarm = self.guard.alarm
        if acc.is_main_process and alarm is not None and alarm.step == step:
            self.run.console.print(f"[bold red]{alarm.message(self.cfg.trained_metric)}[/]")
        return bool(flags[1] > 0)

    # --- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> Any | None:
        return self.guard.checkpoint_state()

    def restore(self, path: Path, step: int) -> None:
        """Rank 0's guard continues from the checkpoint's history up to its step; what the run left under guard/
        past that step is removed (those validations come again)."""
        if not self.run.acc.is_main_process:
            return
        state = load_extra(path, self.name)  # read first: an unreadable guard.pt changes nothing under guard/
        self.guard.forget_after(step)
        if state is None:
            self.run.console.print(
                f"[yellow]checkpoint {path} holds no guard history (guard.pt)[/]: the reward-hacking guard starts "
                "afresh"
            )
            return
        self.guard.load_checkpoint_state(state, step)

    # --- the end ----------------------------------------------------------------------------------------------
    def before_export(self, stopped: bool) -> None:
        """A stopped run exports the guard's rollback step (`Guard.rollback_step`): its checkpoint's model and EMA
        weights, on every rank."""
        if not stopped:
            return
        acc = self.run.acc
        found = self.guard.best_checkpoint() if acc.is_main_process else None
        paths = [str(found) if found else ""]
        if acc.num_processes > 1:
            torch.distributed.broadcast_object_list(paths, src=0)
        if paths[0]:
            tensors, _, _ = load_checkpoint(Path(paths[0]))
            self.run.load_weights(tensors)
            self.rolled_back = Path(paths[0])

    def after_export(self, stopped: bool, export_dir: Path | None) -> None:
        """The final message of a run the guard stopped (rank 0)."""
        if not (stopped and self.run.acc.is_main_process):
            return
        alarm = self.guard.alarm
        where = f"{export_dir}" if export_dir else "nowhere (train.ckpt.export_safetensors = false)"
        why = (
            "best by the guard"
            if self.cfg.rollback == "best"
            else "the newest validation within every margin"
        )
        what = (
            f"the step-{self.guard.rollback_step()} weights ({why})"
            if self.rolled_back
            else "the last weights"
        )
        self.run.console.print(
            f"[bold yellow]stopped by the reward-hacking guard at step {alarm.step}[/]: "
            f"{alarm.message(self.cfg.trained_metric)}. Exported {what} to {where}; grids and alarm.json in "
            f"{self.guard.root}."
        )
