"""The shared training loop, built on `accelerate.Accelerator`.

Per optimizer step: the task yields micro-batches; each loss is divided by their number before backward (so
accumulation over micro-batches equals one big batch), gradients are clipped, the optimizer and LR schedule step,
then the task hook and the EMA run. Every step appends one JSON object to `metrics.jsonl`. The loop composes its
parts: the trained state (train_state.py: module, optimizer, schedule, EMA), checkpoints (run_folder/run_checkpoints.py: every
`train.ckpt.save_freq` steps or `save_every_minutes`, holding everything resume needs), validations
(validation.py) and the run's components (component_hooks.py: the reward-hacking guard), whose state every checkpoint
holds. Data order and noise are pure functions of (seed, step, rank), so a resumed run continues exactly like an
uninterrupted one.

Many processes (`accelerate launch`, docs/multi-gpu.md): DDP or FSDP2 through accelerate. Every rank runs the same
loop; gradients are averaged by the wrapper; logged metrics are reduced over ranks (mean; min / max for `*min` /
`*max` keys); only rank 0 writes files. Under FSDP the sharded weights, EMA shadow and optimizer state are gathered
into full tensors for checkpoints and exports (all ranks take part, rank 0 writes), so a checkpoint has the same
layout whatever the world size and sharding; resuming it needs the same world size (per-rank noise streams).
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from rich.console import Console

from sanarl.config.loader import config_to_dict
from sanarl.config.schema import Config
from sanarl.errors import Interrupted, UserError
from sanarl.rewards.combine import RewardFailure
from sanarl.rewards.held_out import build_rewards
from sanarl.training.component_set import build_components
from sanarl.training.data_order import step_generator
from sanarl.training.distributed import full_parameters, is_fsdp, rank0_minutes_passed, reduce_metrics, scalar
from sanarl.training.faults import pause_point
from sanarl.training.progress import StepProgress
from sanarl.training.protocol import Task, planned_steps, run_settings
from sanarl.training.reward_stop import rewards_failed
from sanarl.training.run_folder.checkpoint_store import resolve_resume
from sanarl.training.run_folder.exports import write_export
from sanarl.training.run_folder.resume import ResumePlan
from sanarl.training.run_folder.run_checkpoints import Checkpointer
from sanarl.training.stopping import StopRequests
from sanarl.training.tracking import MetricsLogger, plot_run_metrics
from sanarl.training.train_state import Tensors, TrainState, divergence
from sanarl.training.validation import Validation


@dataclass
class RunResult:
    """What a finished run left behind."""

    run_dir: Path
    steps: int
    last_metrics: dict[str, float]
    export_dir: Path | None


class Runner:
    """Owns the loop; the task owns data and objective. The loop composes the trained state
    (train_state.py), checkpoints (run_folder/run_checkpoints.py), validations (validation.py) and the run's components
    (component_hooks.py), and calls them in the order `_train_loop` reads."""

    def __init__(
        self,
        cfg: Config,
        task: Task,
        accelerator: Accelerator,
        run_dir: Path,
        plan: ResumePlan | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        """`plan`: the checkpoint to resume from (sanarl/training/run_folder/resume.py; None: `train.resume` resolved here,
        unverified); `record`: what every checkpoint's meta.json records besides the step (config, plugin)."""
        self.cfg, self.task, self.acc, self.run_dir = cfg, task, accelerator, run_dir
        self.stops = StopRequests()
        self.console = Console()
        self.state = TrainState(cfg, task, accelerator)
        self.wrapped, self.params = self.state.wrapped, self.state.params
        task.adapter.forward_module = self._compiled(self.wrapped)
        task.launch_check(is_fsdp(accelerator))
        self.total_steps = planned_steps(run_settings(cfg), task.steps_per_epoch())
        self.start_step = 0
        # the rewards of `validation.held_out_rewards`, built on first use (rank 0 scores the validations)
        held_out = functools.cache(lambda: build_rewards(cfg.validation.held_out_rewards))
        self.components = build_components(cfg, self, run_dir, held_out)
        self.checkpoints = Checkpointer(cfg, self.state, run_dir, record or {}, self.components)
        self.validation = Validation(cfg, self.state, run_dir, self.components, held_out)
        if plan is None:
            try:
                plan = ResumePlan(path=resolve_resume(cfg.train.resume, self.checkpoints.root))
            except ValueError as err:
                raise UserError(str(err)) from None
        self.resume_path = plan.path

    def _compiled(self, module: torch.nn.Module) -> torch.nn.Module:
        """`train.compile`: torch.compile the trained forward (mode "default"; the DDP / FSDP wrapper inside), which
        the rollout also calls when it samples with the policy itself. Rollout inference copies are compiled
        separately with `rollout.compile_mode`."""
        if not self.cfg.train.compile:
            return module
        return torch.compile(module)

    # --- what a component may use (component_hooks.RunHandle) -------------------------------------------------------
    def full_state(self) -> tuple[Tensors, dict]:
        return self.state.full_state()

    def load_weights(self, tensors: Tensors) -> None:
        self.state.load_weights(tensors)

    def _diverged(self, step: int, what: str) -> None:
        raise divergence(self.cfg, self.checkpoints.root, step, what)

    # --- one step -----------------------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """One optimizer step on this rank; returns its metrics reduced over all ranks."""
        rng = step_generator(self.cfg.train.seed, step, self.acc.process_index)
        t0 = time.perf_counter()
        try:
            micro = self.task.micro_batches(step, rng)  # the rollout and its rewards, for RL tasks
        except RewardFailure as err:
            raise rewards_failed(self.cfg, self.checkpoints.root, step + 1, err) from err
        t1 = time.perf_counter()
        sums: dict[str, float] = dict(self.task.collect_metrics())
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1
            sync = contextlib.nullcontext() if last else self.acc.no_sync(self.wrapped)
            with sync, self.acc.autocast():
                loss, metrics = self.task.objective(batch, rng)
                self.acc.backward(loss / len(micro))
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) / len(micro)
        clip = self.cfg.train.optm_grad_norm_clip
        grad_norm = self.acc.clip_grad_norm_(self.params, clip if clip > 0 else float("inf"))
        # the same global norm on every rank; float16's loss scaler skips such steps itself
        if not math.isfinite(scalar(grad_norm)) and self.cfg.train.param_dtype != "float16":
            self._diverged(step + 1, f"the gradient norm is {scalar(grad_norm)} (the update was not applied)")
        state = self.state
        state.ema_before_update(step, self.task.sample_batches(micro))
        state.optimizer.step()
        state.scheduler.step()
        state.optimizer.zero_grad(set_to_none=True)
        sums.update(self.task.after_optimizer_step(step + 1))
        state.ema_after_update(step + 1)
        t2 = time.perf_counter()
        samples = self.cfg.train.train_batch_per_replica
        sums.update(
            grad_norm=scalar(grad_norm),
            lr=state.scheduler.get_last_lr()[0],
            time_data=t1 - t0,
            time_train=t2 - t1,
            samples_per_s=samples / max(t2 - t0, 1e-9),
        )
        return reduce_metrics(self.acc, sums)

    # --- export -----------------------------------------------------------------------------------------------
    def export(self) -> Path | None:
        """The final model (EMA weights when on) to `export/`: gathered on every rank, written by rank 0."""
        if not self.cfg.train.ckpt.export_safetensors:
            return None
        target = self.run_dir / "export"
        if not self.state.finite():
            self._diverged(
                self.total_steps, f"the weights hold inf / nan before the export of step {self.total_steps}"
            )
        error = ""
        with self.state.ema_weights(), full_parameters(self.wrapped):
            if self.acc.is_main_process:
                try:  # staged, then renamed over the old export (run_folder/exports.py)
                    write_export(self.run_dir, self.task.export)
                except UserError as err:
                    error = str(err)
        error = self.checkpoints.from_main(error)  # a full disk stops every rank
        if error:
            raise UserError(error)
        return target if self.acc.is_main_process else None

    # --- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        try:
            return self._run()
        except RewardFailure as err:  # a validation's rewards (a step's are stopped in train_step)
            raise rewards_failed(self.cfg, self.checkpoints.root, None, err) from err
        finally:
            self.task.close()

    def _run(self) -> RunResult:
        self.task.run_dir = self.run_dir
        self.start_step = self.checkpoints.resume(self.resume_path)
        if self.resume_path is not None:
            self.console.print(f"[bold]resumed[/] from {self.resume_path} at step {self.start_step}")
        logger = self._open_logger()
        try:  # the logger is closed on every exit, an error mid-run included
            with self.stops.installed():
                return self._run_logged(logger)
        finally:
            logger.close()

    def _stop_on_signal(self, done: int, signum: int, logger: MetricsLogger) -> None:
        """SIGINT / SIGTERM: a final checkpoint of step `done` on every rank, then (validation on) the grid of the
        weights it holds, then `Interrupted`."""
        self.checkpoints.save(done)
        if self.cfg.validation.enable:
            self.validation.sample(done, logger)
        name = signal.Signals(signum).name
        where = (
            self.checkpoints.root
            if self.cfg.train.ckpt.enable_checkpoint
            else "nowhere (checkpoints are off)"
        )
        raise Interrupted(
            f"{name} at step {done}: checkpoint written to {where}; continue with `--set train.resume=true`.",
            signum,
        )

    def _run_logged(self, logger: MetricsLogger) -> RunResult:
        val = self.cfg.validation
        if val.enable and val.val_before_train and self.start_step == 0:
            self.validation.run(0, logger)
        metrics, stopped = self._train_loop(logger)
        export_dir = self._finish(logger, stopped)
        self.acc.wait_for_everyone()
        signum = self.stops.agreed(self.acc.device, self.acc.num_processes)
        if signum:  # it came during the final checkpoint or the export, which were completed
            written = " and the export were" if self.cfg.train.ckpt.export_safetensors else " was"
            raise Interrupted(
                f"{signal.Signals(signum).name} during the end of the run: the final checkpoint of step "
                f"{self.total_steps}{written} completed first.",
                signum,
            )
        return RunResult(self.run_dir, self.total_steps, metrics, export_dir)

    def _open_logger(self) -> MetricsLogger:
        cfg = self.cfg
        try:
            return MetricsLogger(
                self.run_dir,
                cfg.logging.logger,
                project=cfg.logging.project_name,
                experiment=cfg.logging.experiment_name,
                config=config_to_dict(cfg),
                enabled=self.acc.is_main_process,
                resume=self.start_step > 0,
                resume_step=self.start_step,
                notice=lambda text: self.console.print(f"[yellow]note:[/] {text}", highlight=False),
            )
        except ImportError as err:
            raise UserError(str(err)) from None

    def _train_loop(self, logger: MetricsLogger) -> tuple[dict[str, float], bool]:
        """Steps start_step .. total_steps; returns the last step's metrics and whether a component asked to stop.

        After each optimizer step, in this order: log its metrics (a non-finite loss stops the run), act on an
        agreed SIGINT / SIGTERM (checkpoint, then stop), the components' `on_step`, the wall-clock limit, the
        progress bar, then the step's checkpoint and validation when due, the checkpoint after the validation when
        a component's checkpointed state includes it (`_save_after_validation`)."""
        stopped = False
        metrics: dict[str, float] = {}
        with self._progress() as progress:
            started = time.monotonic()
            self.checkpoints.start_clock()
            for step in range(self.start_step, self.total_steps):
                metrics = self.train_step(step)
                done = step + 1
                logger.log(done, metrics)
                if not math.isfinite(metrics.get("loss", 0.0)):  # reduced: the same on every rank
                    self._diverged(done, f"the loss is {metrics['loss']}")
                pause_point(f"step_{done}")
                signum = self.stops.agreed(self.acc.device, self.acc.num_processes)
                if signum:
                    self._stop_on_signal(done, signum, logger)
                for component in self.components:
                    component.on_step(done, metrics)
                if rank0_minutes_passed(self.acc, started, self.cfg.train.max_wall_minutes):
                    self.total_steps = done
                    self.console.print(
                        f"[yellow]train.max_wall_minutes = {self.cfg.train.max_wall_minutes} reached[/]: "
                        f"stopping after step {done}"
                    )
                progress.report(done, self.total_steps, metrics)
                if not self._save_after_validation:
                    self.checkpoints.save_if_due(done, self.total_steps)
                if self.validation.due(done, self.total_steps):
                    stopped = self.validation.run(done, logger)
                    if stopped:
                        self.total_steps = done
                if self._save_after_validation:
                    self.checkpoints.save_if_due(done, self.total_steps)
                if done >= self.total_steps:
                    break
        return metrics, stopped

    def _progress(self) -> StepProgress:
        """The console's progress over the run's steps (rank 0): a bar on a terminal, plain lines elsewhere."""
        log_freq, main = self.cfg.logging.log_freq, self.acc.is_main_process
        return StepProgress(self.console, self.start_step, self.total_steps, log_freq, enabled=main)

    @property
    def _save_after_validation(self) -> bool:
        """Whether a step's checkpoint waits for its validation: when a component's checkpointed state includes
        it (a resumed run never repeats that validation); otherwise it comes first, so a failing validation never
        costs the step's checkpoint."""
        return any(component.saves_after_validation for component in self.components)

    def _finish(self, logger: MetricsLogger, stopped: bool) -> Path | None:
        """Final checkpoint and validation (in `_save_after_validation`'s order), the components' hooks around the
        export, and the metrics plot."""
        if not self._save_after_validation:
            self.checkpoints.save(self.total_steps)
        if self.cfg.validation.enable and not stopped:
            stopped = self.validation.run(self.total_steps, logger)
        if self._save_after_validation:
            self.checkpoints.save(self.total_steps)
        for component in self.components:
            component.before_export(stopped)
        export_dir = self.export()
        for component in self.components:
            component.after_export(stopped, export_dir)
        if self.acc.is_main_process:
            plot_run_metrics(self.run_dir)
        return export_dir
