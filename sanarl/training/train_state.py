"""The trained state of a run: what one optimizer step changes and a checkpoint keeps.

The trained module (wrapped by accelerate: DDP or FSDP2), its parameters, the optimizer with its LR schedule and
the EMA shadow. Whole copies of them go into checkpoints and exports (FSDP: gathered, every rank takes part) and
come back at resume or at a rollback (each rank keeps its shard).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from accelerate import Accelerator

from sanarl.config.schema import Config
from sanarl.errors import Diverged, UserError
from sanarl.training.distributed import (
    full_parameters,
    full_tensors,
    gathered_optimizer_state,
    load_optimizer_state,
    shard_like,
)
from sanarl.training.ema import EMA
from sanarl.training.grad_layout import match_bucket_strides
from sanarl.training.protocol import Task
from sanarl.training.run_folder.setup import build_optimizer, warmup_schedule

Tensors = dict[str, dict[str, torch.Tensor]]
"""`{"model": {name: tensor}, "ema": {...}}`: a checkpoint's weight groups."""


class TrainState:
    """The task's trainable parameters, prepared by `acc`, with their optimizer, LR schedule and EMA."""

    def __init__(self, cfg: Config, task: Task, acc: Accelerator) -> None:
        if not task.trainable_parameters():
            raise UserError(
                "nothing to train: no parameter requires grad (check [policy.lora].target_modules)."
            )
        self.task, self.acc = task, acc
        optimizer = build_optimizer(cfg, [p for _, p in task.trainable_parameters()])
        self.scheduler = warmup_schedule(optimizer, cfg.train.optm_warmup_steps)
        # model and optimizer in one call: FSDP2 swaps the parameters for shards and re-points the optimizer
        self.wrapped, self.optimizer = acc.prepare(task.adapter.trainable_module(), optimizer)
        match_bucket_strides(self.wrapped)  # DDP: gradients arrive in their bucket's layout
        named = task.trainable_parameters()
        self.params = [p for _, p in named]
        t = cfg.train
        self.ema = (
            EMA(named, decay=t.ema_decay, interval=t.ema_update_step_interval) if t.ema_enable else None
        )
        self.ema_per_sample_batch = t.ema_update_per == "sample_batch"

    # --- whole copies ---------------------------------------------------------------------------------------------
    def full_state(self) -> tuple[Tensors, dict]:
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

    def load_weights(self, tensors: Tensors) -> None:
        """A checkpoint's model tensors into the task and, with EMA, its shadow (FSDP: each rank keeps its shard)."""
        self.task.load_state_tensors(tensors["model"])
        if self.ema is not None and "ema" in tensors:
            ema = tensors["ema"]
            self.ema.shadow = [
                shard_like(ema[n], s) for n, s in zip(self.ema.names, self.ema.shadow, strict=True)
            ]

    def load_optimizer(self, state: dict) -> None:
        """A checkpoint's optimizer and LR-schedule state (FSDP: resharded)."""
        load_optimizer_state(self.acc, self.wrapped, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def check_shapes(self, path: Path, tensors: Tensors) -> None:
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

    # --- the weights in use -------------------------------------------------------------------------------------
    def finite(self) -> bool:
        """Whether every trained weight and the EMA shadow are finite, on every rank (one device sync)."""
        tensors = list(self.params) + (list(self.ema.shadow) if self.ema is not None else [])
        flags = [torch.isfinite(_local(t)).all() for t in tensors]
        bad = (~torch.stack(flags).all()).float().reshape(1).to(self.acc.device)
        if self.acc.num_processes > 1:
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        return bad.item() == 0

    # --- the EMA's updates --------------------------------------------------------------------------------------
    def ema_before_update(self, done: int, sample_batches: int) -> None:
        """Before the optimizer step that follows `done` steps: with `ema_update_per = "sample_batch"`, one EMA
        update at `done` for each of the step's sample batches but its last (flow_grpo's train_sd3.py calls
        `ema.step(params, global_step)` after every sample batch; the weights only change at the step)."""
        if self.ema is None or not self.ema_per_sample_batch:
            return
        for _ in range(sample_batches - 1):
            self.ema.update(self.params, done)

    def ema_after_update(self, done: int) -> None:
        """After the optimizer step that makes `done` steps: one EMA update at `done` (the references pass their
        global step after counting this update, 1 first)."""
        if self.ema is not None:
            self.ema.update(self.params, done)

    @contextlib.contextmanager
    def ema_weights(self) -> Iterator[None]:
        """Swap the EMA weights in (validation and export use them), restore after."""
        if self.ema is None:
            yield
            return
        with self.ema.swap(self.params):
            yield


def divergence(cfg: Config, ckpt_root: Path, step: int, what: str) -> Diverged:
    """The error of a run that diverged at `step` (`what` happened): nothing of it is saved, and the likely causes."""
    t = cfg.train
    return Diverged(
        f"training diverged at step {step}: {what}. Nothing was saved or exported from it; the newest "
        f"checkpoint in {ckpt_root} (if any) holds finite weights. Likely causes: a learning rate too high "
        f"(train.optm_lr = {t.optm_lr:g}), no gradient clipping (train.optm_grad_norm_clip = "
        f"{t.optm_grad_norm_clip:g}), float16 overflow (train.param_dtype = {t.param_dtype}) or non-finite "
        "training data. Start again with a lower `train.optm_lr` (`train.resume = false` or another "
        "`train.output_dir`)."
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP-sharded DTensor) tensor."""
    return t.to_local() if hasattr(t, "to_local") else t
