"""The shared training loop, built on `accelerate.Accelerator`.

Per optimizer step: the task yields micro-batches; each loss is divided by their number before backward (so
accumulation over micro-batches equals one big batch), gradients are clipped, the optimizer and LR schedule step,
then the task hook and the EMA run. Every step appends one JSON object to `metrics.jsonl`. Checkpoints every
`train.ckpt.save_freq` steps hold everything resume needs, the state of the run's components included
(sanarl/training/components.py: the reward-hacking guard); data order and noise are pure functions of (seed, step,
rank), so a resumed run continues exactly like an uninterrupted one.

Many processes (`accelerate launch`, docs/multi-gpu.md): DDP or FSDP2 through accelerate. Every rank runs the same
loop; gradients are averaged by the wrapper; logged metrics are reduced over ranks (mean; min / max for `*min` /
`*max` keys); only rank 0 writes files. Under FSDP the sharded weights, EMA shadow and optimizer state are gathered
into full tensors for checkpoints and exports (all ranks take part, rank 0 writes), so a checkpoint has the same
layout whatever the world size and sharding; resuming it needs the same world size (per-rank noise streams).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

from sanarl.config.loader import config_to_dict
from sanarl.config.schema import Config
from sanarl.core.media import save_media
from sanarl.errors import Diverged, Interrupted, UserError
from sanarl.rewards.scoring import build_rewards, score_images
from sanarl.rewards.summary import describe
from sanarl.training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    umask_modes,
)
from sanarl.training.data_order import step_generator
from sanarl.training.distributed import (
    full_parameters,
    full_tensors,
    gathered_optimizer_state,
    is_fsdp,
    load_optimizer_state,
    reduce_metrics,
    scalar,
    shard_like,
)
from sanarl.training.ema import EMA
from sanarl.training.faults import pause_point
from sanarl.training.protocol import Task, planned_steps, run_settings
from sanarl.training.resume import ResumePlan
from sanarl.training.run_components import build_components
from sanarl.training.sampling import GenerationSpec, generate_images
from sanarl.training.setup import build_optimizer, warmup_schedule
from sanarl.training.stopping import StopRequests
from sanarl.training.tracking import MetricsLogger, plot_metrics


@dataclass
class RunResult:
    """What a finished run left behind."""

    run_dir: Path
    steps: int
    last_metrics: dict[str, float]
    export_dir: Path | None


PLOTTED_METRICS = ["reward/mean", "loss", "policy_loss", "grad_norm", "lr"]
"""metrics.png's panels (those the run logs)."""


class Runner:
    """Owns the loop; the task owns data and objective."""

    def __init__(
        self,
        cfg: Config,
        task: Task,
        accelerator: Accelerator,
        run_dir: Path,
        plan: ResumePlan | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        """`plan`: the checkpoint to resume from (sanarl/training/resume.py; None: `train.resume` resolved here,
        unverified); `record`: what every checkpoint's meta.json records besides the step (config, plugin)."""
        self.cfg, self.task, self.acc, self.run_dir = cfg, task, accelerator, run_dir
        self.record = dict(record or {})
        self.stops = StopRequests()
        self.console = Console()
        self.ckpt_root = run_dir / "checkpoints"
        if not task.trainable_parameters():
            raise UserError(
                "nothing to train: no parameter requires grad (check [policy.lora].target_modules)."
            )
        optimizer = build_optimizer(cfg, [p for _, p in task.trainable_parameters()])
        self.scheduler = warmup_schedule(optimizer, cfg.train.optm_warmup_steps)
        # model and optimizer in one call: FSDP2 swaps the parameters for shards and re-points the optimizer
        self.wrapped, self.optimizer = accelerator.prepare(task.adapter.trainable_module(), optimizer)
        named = task.trainable_parameters()
        self.params = [p for _, p in named]
        self.ema = (
            EMA(named, decay=cfg.train.ema_decay, interval=cfg.train.ema_update_step_interval)
            if cfg.train.ema_enable
            else None
        )
        task.adapter.forward_module = self._compiled(self.wrapped)
        task.launch_check(is_fsdp(accelerator))
        self.total_steps = self._total_steps()
        self.start_step = 0
        self._held_out = None
        self.components = build_components(cfg, self, run_dir, self.held_out_rewards)
        if plan is None:
            try:
                plan = ResumePlan(path=resolve_resume(cfg.train.resume, self.ckpt_root))
            except ValueError as err:
                raise UserError(str(err)) from None
        self.resume_path = plan.path

    def held_out_rewards(self) -> dict:
        """The rewards of `validation.held_out_rewards`, built on first use (rank 0 scores the validations)."""
        if self._held_out is None:
            self._held_out = build_rewards(self.cfg.validation.held_out_rewards)
        return self._held_out

    def _compiled(self, module: torch.nn.Module) -> torch.nn.Module:
        """`train.compile`: torch.compile the trained forward (mode "default"; the DDP / FSDP wrapper inside).
        Rollout inference copies are compiled separately with `rollout.compile_mode`."""
        if not self.cfg.train.compile:
            return module
        return torch.compile(module)

    def _total_steps(self) -> int:
        return planned_steps(run_settings(self.cfg), self.task.steps_per_epoch())

    # --- checkpoints --------------------------------------------------------------------------------------------
    def full_state(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
        """Model / EMA tensors and optimizer state, whole (FSDP: gathered; every rank takes part)."""
        with full_parameters(self.wrapped):
            tensors = {"model": dict(self.task.state_tensors())}
        if self.ema is not None:
            tensors["ema"] = full_tensors(dict(zip(self.ema.names, self.ema.shadow, strict=True)))
        state = {
            "optimizer": gathered_optimizer_state(self.acc, self.wrapped, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
        }
        return tensors, state

    def save(self, step: int) -> None:
        """Checkpoint `step`: every rank gathers, rank 0 writes, all wait for it (and share its failure: a full
        disk stops every rank with exit 2). Non-finite weights are never saved (`Diverged`)."""
        ckpt = self.cfg.train.ckpt
        if not ckpt.enable_checkpoint:
            return
        self._check_finite_weights(step, "checkpoint")
        tensors, state = self.full_state()
        error = ""
        if self.acc.is_main_process:
            meta = {
                **self.record,
                "world_size": self.acc.num_processes,
                "distributed_type": self.acc.distributed_type.value,
            }
            kept = {c.name: c.checkpoint_state() for c in self.components}
            extras = {name: value for name, value in kept.items() if value is not None} or None
            try:
                save_checkpoint(self.ckpt_root, step, tensors, state, meta, ckpt.max_keep, extras)
                self.plot_metrics()
            except CheckpointError as err:
                error = str(err)
        error = self._from_main(error)
        if error:
            raise CheckpointError(error)

    def _from_main(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a barrier too)."""
        if self.acc.num_processes == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    # --- divergence -----------------------------------------------------------------------------------------------
    def _check_finite_weights(self, step: int, before: str) -> None:
        """Raise `Diverged` (on every rank) when a trained weight or the EMA shadow holds inf / nan."""
        tensors = list(self.params) + (list(self.ema.shadow) if self.ema is not None else [])
        finite = [
            torch.isfinite(_local(t)).all() for t in tensors
        ]  # one device sync below, not one per tensor
        bad = (~torch.stack(finite).all()).float().reshape(1).to(self.acc.device)
        if self.acc.num_processes > 1:
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        if bad.item() > 0:
            self._diverged(step, f"the weights hold inf / nan before the {before} of step {step}")

    def _diverged(self, step: int, what: str) -> None:
        t = self.cfg.train
        raise Diverged(
            f"training diverged at step {step}: {what}. Nothing was saved or exported from it; the newest "
            f"checkpoint in {self.ckpt_root} (if any) holds finite weights. Likely causes: a learning rate too high "
            f"(train.optm_lr = {t.optm_lr:g}), no gradient clipping (train.optm_grad_norm_clip = "
            f"{t.optm_grad_norm_clip:g}), float16 overflow (train.param_dtype = {t.param_dtype}) or non-finite "
            "training data. Start again with a lower `train.optm_lr` (`train.resume = false` or another "
            "`train.output_dir`)."
        )

    def plot_metrics(self) -> Path | None:
        """metrics.png from metrics.jsonl so far (main process; at each checkpoint and at the end)."""
        return plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir / "metrics.png", PLOTTED_METRICS)

    def maybe_resume(self) -> None:
        """Load `self.resume_path` on every rank (multi-node: the output dir must be on a shared filesystem)."""
        path = self.resume_path
        if path is None:
            return
        tensors, state, meta = load_checkpoint(path)
        if meta.get("world_size", 1) != self.acc.num_processes:
            raise UserError(
                f"checkpoint {path} was written by {meta.get('world_size')} processes but this run has "
                f"{self.acc.num_processes}; resume with the same world size (the timestep / noise generators are "
                "per (seed, step, rank), so only then does the run continue exactly), or start a new run from its "
                "export (docs/multi-gpu.md, 'Resuming')."
            )
        self._check_shapes(path, tensors)
        self.load_weights(tensors)
        self.task.after_resume()  # e.g. inference copies re-merged from the restored weights
        load_optimizer_state(self.acc, self.wrapped, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.start_step = int(meta["step"])
        for component in self.components:
            component.restore(path, self.start_step)
        self.console.print(f"[bold]resumed[/] from {path} at step {self.start_step}")

    def load_weights(self, tensors: dict[str, dict[str, torch.Tensor]]) -> None:
        """A checkpoint's model tensors into the task and, with EMA, its shadow (FSDP: each rank keeps its shard)."""
        self.task.load_state_tensors(tensors["model"])
        if self.ema is not None and "ema" in tensors:
            ema = tensors["ema"]
            self.ema.shadow = [
                shard_like(ema[n], s) for n, s in zip(self.ema.names, self.ema.shadow, strict=True)
            ]

    def _check_shapes(self, path: Path, tensors: dict[str, dict[str, torch.Tensor]]) -> None:
        """The checkpoint's model (and EMA) tensors are this model's: same names and shapes."""
        expected = {k: tuple(v.shape) for k, v in self.task.state_tensors().items()}
        groups = {"model": expected}
        if self.ema is not None:
            groups["ema"] = {n: tuple(s.shape) for n, s in zip(self.ema.names, self.ema.shadow, strict=True)}
        for group, want in groups.items():
            if group not in tensors:
                raise UserError(
                    f"{path / (group + '.safetensors')} is missing (train.ema_enable = true needs the EMA shadow); "
                    "resume from another checkpoint with `train.resume = <path>`, or start fresh with "
                    "`train.resume = false`."
                )
            have = {k: tuple(v.shape) for k, v in tensors[group].items()}
            if have != want:
                odd = sorted(set(have) ^ set(want)) or [k for k in want if have[k] != want[k]]
                raise UserError(
                    f"{path / (group + '.safetensors')} does not fit this model ({len(have)} tensors vs "
                    f"{len(want)}; first differences: {', '.join(odd[:3])}): it is another model's or another "
                    "LoRA shape's. Point `train.resume` at a checkpoint of this model, or set "
                    "`train.resume = false` to start fresh."
                )

    # --- one step -----------------------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """One optimizer step on this rank; returns its metrics reduced over all ranks."""
        rng = step_generator(self.cfg.train.seed, step, self.acc.process_index)
        t0 = time.perf_counter()
        micro = self.task.micro_batches(step, rng)
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
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums.update(self.task.after_optimizer_step(step + 1))
        if self.ema is not None:  # the references pass their global step after counting this update (1 first)
            self.ema.update(self.params, step + 1)
        t2 = time.perf_counter()
        samples = self.cfg.train.train_batch_per_replica
        sums.update(
            grad_norm=scalar(grad_norm),
            lr=self.scheduler.get_last_lr()[0],
            time_data=t1 - t0,
            time_train=t2 - t1,
            samples_per_s=samples / max(t2 - t0, 1e-9),
        )
        return reduce_metrics(self.acc, sums)

    def _out_of_time(self, started: float) -> bool:
        """Has `train.max_wall_minutes` passed since `started`? Rank 0's clock decides for every rank."""
        return self._minutes_passed(started, self.cfg.train.max_wall_minutes)

    def _minutes_passed(self, since: float, minutes: float | None) -> bool:
        """Have `minutes` (None: never) passed on rank 0's monotonic clock since `since`? Same answer on all ranks."""
        if minutes is None:
            return False
        over = torch.tensor([float(time.monotonic() - since >= 60.0 * minutes)], device=self.acc.device)
        if self.acc.num_processes > 1:
            torch.distributed.broadcast(over, src=0)
        return bool(over.item() > 0)

    # --- validation and export ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def ema_weights(self):
        """Swap the EMA weights in (eval and export use them), restore after."""
        if self.ema is None:
            yield
            return
        backup = [p.detach().clone() for p in self.params]
        self.ema.copy_to(self.params)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup, strict=True):
                    p.copy_(b)

    @torch.no_grad()
    def validate(self, step: int, logger: MetricsLogger) -> Path | None:
        """Sample the validation grid and save it (rank 0). Without FSDP only rank 0 samples, with the plain
        module (a DDP forward would wait for the other ranks); under FSDP every rank samples (each forward gathers
        the shards) and rank 0 saves."""
        val, fsdp, adapter = self.cfg.validation, is_fsdp(self.acc), self.task.adapter
        if not (fsdp or self.acc.is_main_process):
            return None
        prompts = self.task.validation_prompts(val.num_samples)
        spec = GenerationSpec.from_sample_config(
            self.cfg.policy.diffusers.sample,
            adapter,
            self.cfg.policy.diffusers.inference_size,
            evaluation=True,
        )
        seeds = [self.cfg.train.seed + i for i in range(len(prompts))]
        module, forward = adapter.trainable_module(), adapter.forward_module
        adapter.forward_module = forward if fsdp else None
        module.eval()
        try:
            with self.ema_weights():
                images = generate_images(adapter, prompts, seeds, spec, batch_size=val.batch_size)
        finally:
            module.train()
            adapter.forward_module = forward
        if not self.acc.is_main_process:
            return None
        title = (
            f"step {step}: validation samples (EMA weights)"
            if self.ema is not None
            else f"step {step}: validation samples"
        )
        path = save_media(images, prompts, self.run_dir / "samples" / f"step_{step:08d}", title=title)
        logger.log_media(step, "samples", path)
        logged = self._log_held_out_rewards(step, logger, images, prompts)
        for component in self.components:
            component.observe(step, images, prompts, logged)
        return path

    def _log_held_out_rewards(self, step: int, logger: MetricsLogger, images, prompts: list[str]) -> dict:
        """Score the validation samples with `validation.held_out_rewards` (rewards the run does not train on) and
        log their means as `heldout/<reward>/<key>`, with the components' own metrics of the samples (the guard's
        image statistics `heldout/image/<stat>`). Returns what was logged."""
        logged: dict[str, float] = {}
        if self.cfg.validation.held_out_rewards:
            metadata = self.task.validation_metadata(len(prompts))
            scores = score_images(images, prompts, metadata, self.held_out_rewards())
            logged = {f"heldout/{key}": describe(values)["mean"] for key, values in scores.items()}
        for component in self.components:
            logged.update(component.validation_metrics(images))
        if logged:
            logger.log(step, logged)
        return logged

    def _after_validation(self, step: int, logger: MetricsLogger) -> bool:
        """Every component's `after_validation` (all of them run); whether any asks the run to stop."""
        stops = [component.after_validation(step, logger) for component in self.components]
        return any(stops)

    def export(self) -> Path | None:
        """The final model (EMA weights when on) to `export/`: gathered on every rank, written by rank 0."""
        if not self.cfg.train.ckpt.export_safetensors:
            return None
        target = self.run_dir / "export"
        self._check_finite_weights(self.total_steps, "export")
        with self.ema_weights(), full_parameters(self.wrapped):
            if self.acc.is_main_process:
                target.mkdir(parents=True, exist_ok=True)
                self.task.export(target)
                umask_modes(target)
        self.acc.wait_for_everyone()
        return target if self.acc.is_main_process else None

    # --- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        try:
            return self._run()
        finally:
            self.task.close()

    def _run(self) -> RunResult:
        self.task.run_dir = self.run_dir
        self.maybe_resume()
        logger = self._open_logger()
        try:  # the logger is closed on every exit, an error mid-run included
            with self.stops.installed():
                return self._run_logged(logger)
        finally:
            logger.close()

    def _stop_on_signal(self, done: int, signum: int) -> None:
        """SIGINT / SIGTERM: a final checkpoint of step `done` on every rank, then `Interrupted`."""
        import signal

        self.save(done)
        name = signal.Signals(signum).name
        where = self.ckpt_root if self.cfg.train.ckpt.enable_checkpoint else "nowhere (checkpoints are off)"
        raise Interrupted(
            f"{name} at step {done}: checkpoint written to {where}; continue with `--set train.resume=true`.",
            signum,
        )

    def _run_logged(self, logger: MetricsLogger) -> RunResult:
        val = self.cfg.validation
        if val.enable and val.val_before_train and self.start_step == 0:
            self.validate(0, logger)
            self._after_validation(0, logger)
        metrics, stopped = self._train_loop(logger)
        export_dir = self._finish(logger, stopped)
        self.acc.wait_for_everyone()
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
        """Steps start_step .. total_steps with their logging, checkpoints and validations; returns the last
        step's metrics and whether a component asked to stop."""
        cfg, val = self.cfg, self.cfg.validation
        stopped = False
        metrics: dict[str, float] = {}
        columns = (
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),  # wraps, never cut
        )
        with Progress(*columns, console=self.console, disable=not self.acc.is_main_process) as bar:
            job = bar.add_task("train", total=self.total_steps, completed=self.start_step, info="")
            started = last_save = time.monotonic()
            for step in range(self.start_step, self.total_steps):
                metrics = self.train_step(step)
                done = step + 1
                logger.log(done, metrics)
                if not math.isfinite(metrics.get("loss", 0.0)):  # reduced: the same on every rank
                    self._diverged(done, f"the loss is {metrics['loss']}")
                pause_point(f"step_{done}")
                signum = self.stops.agreed(self.acc.device, self.acc.num_processes)
                if signum:
                    self._stop_on_signal(done, signum)
                for component in self.components:
                    component.on_step(done, metrics)
                if self._out_of_time(started):
                    self.total_steps = done
                    self.console.print(
                        f"[yellow]train.max_wall_minutes = {cfg.train.max_wall_minutes} reached[/]: "
                        f"stopping after step {done}"
                    )
                if done % cfg.logging.log_freq == 0 or done == self.total_steps:
                    bar.update(job, completed=done, total=self.total_steps, info=_short(metrics))
                if not self._save_after_validation:
                    last_save = self._save_if_due(done, last_save)
                if val.enable and done % val.freq == 0 and done < self.total_steps:
                    self.validate(done, logger)
                    stopped = self._after_validation(done, logger)
                    if stopped:
                        self.total_steps = done
                if self._save_after_validation:
                    last_save = self._save_if_due(done, last_save)
                if done >= self.total_steps:
                    break
        return metrics, stopped

    @property
    def _save_after_validation(self) -> bool:
        """Whether a step's checkpoint waits for its validation: when a component's checkpointed state includes
        it (a resumed run never repeats that validation); otherwise it comes first, so a failing validation never
        costs the step's checkpoint."""
        return any(component.saves_after_validation for component in self.components)

    def _save_if_due(self, done: int, last_save: float) -> float:
        """The checkpoint of step `done` when `save_freq` or `save_every_minutes` asks for one (not at the last
        step: `_finish` writes that); returns the time of the last save."""
        ckpt = self.cfg.train.ckpt
        timed = self._minutes_passed(last_save, ckpt.save_every_minutes)
        if (done % ckpt.save_freq == 0 or timed) and done < self.total_steps:
            self.save(done)
            return time.monotonic()
        return last_save

    def _finish(self, logger: MetricsLogger, stopped: bool) -> Path | None:
        """Final checkpoint and validation (in `_save_after_validation`'s order), the components' hooks around the
        export, and the metrics plot."""
        if not self._save_after_validation:
            self.save(self.total_steps)
        if self.cfg.validation.enable and not stopped:
            self.validate(self.total_steps, logger)
            stopped = self._after_validation(self.total_steps, logger)
        if self._save_after_validation:
            self.save(self.total_steps)
        for component in self.components:
            component.before_export(stopped)
        export_dir = self.export()
        for component in self.components:
            component.after_export(stopped, export_dir)
        if self.acc.is_main_process:
            self.plot_metrics()
        return export_dir


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP-sharded DTensor) tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _short(metrics: dict[str, float]) -> str:
    keys = [k for k in ("loss", "reward/mean", "grad_norm", "samples_per_s") if k in metrics]
    return "  ".join(f"{k}={metrics[k]:.4g}" for k in keys)
