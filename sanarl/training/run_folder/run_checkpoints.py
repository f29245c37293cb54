"""A run's checkpoints: when one is due, writing it, and resuming from one.

A checkpoint holds everything resume needs: the model and EMA tensors, the optimizer and LR schedule
(`train_state.TrainState`), meta.json (the step, the world size and the run's record: config, plugin) and each
run component's state as `<name>.pt` (sanarl/training/component_hooks.py). Every rank gathers, rank 0 writes into a
staging folder that becomes the checkpoint at once (sanarl/training/run_folder/checkpoint_store.py), so a crash never leaves half a
checkpoint; non-finite weights are never saved.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sanarl.config.schema import Config
from sanarl.errors import UserError
from sanarl.training.component_hooks import RunComponent
from sanarl.training.distributed import rank0_minutes_passed
from sanarl.training.run_folder.checkpoint_store import CheckpointError, load_checkpoint, save_checkpoint
from sanarl.training.tracking import plot_run_metrics
from sanarl.training.train_state import TrainState, divergence


class Checkpointer:
    """`train.ckpt`'s step and timed checkpoints of `state` under `<run_dir>/checkpoints`, with the components'
    states, and the resume from one."""

    def __init__(
        self,
        cfg: Config,
        state: TrainState,
        run_dir: Path,
        record: Mapping[str, Any],
        components: Sequence[RunComponent],
    ) -> None:
        self.cfg, self.state, self.acc, self.run_dir = cfg, state, state.acc, run_dir
        self.root = run_dir / "checkpoints"
        self.record = dict(record)
        self.components = components
        self.last_save = time.monotonic()
        """When the last checkpoint was written, or the loop started (`save_every_minutes` counts from it)."""

    def start_clock(self) -> None:
        """The training loop starts: `save_every_minutes` counts from now."""
        self.last_save = time.monotonic()

    def save(self, step: int) -> None:
        """Checkpoint `step`: every rank gathers, rank 0 writes, all wait for it (and share its failure: a full
        disk stops every rank with exit 2). Non-finite weights are never saved (`Diverged`)."""
        ckpt = self.cfg.train.ckpt
        if not ckpt.enable_checkpoint:
            return
        if not self.state.finite():
            raise divergence(
                self.cfg, self.root, step, f"the weights hold inf / nan before the checkpoint of step {step}"
            )
        tensors, state = self.state.full_state()
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
                save_checkpoint(self.root, step, tensors, state, meta, ckpt.max_keep, extras)
                plot_run_metrics(self.run_dir)
            except CheckpointError as err:
                error = str(err)
        error = self.from_main(error)
        if error:
            raise CheckpointError(error)
        self.last_save = time.monotonic()

    def save_if_due(self, done: int, total: int) -> None:
        """The checkpoint of step `done` when `save_freq` or `save_every_minutes` asks for one (not at the last
        step `total`: the run's end writes that)."""
        ckpt = self.cfg.train.ckpt
        timed = rank0_minutes_passed(self.acc, self.last_save, ckpt.save_every_minutes)
        if (done % ckpt.save_freq == 0 or timed) and done < total:
            self.save(done)

    def resume(self, path: Path | None) -> int:
        """Load the checkpoint at `path` on every rank (multi-node: the output dir must be on a shared filesystem)
        into the state, the task and the components; returns its step (0 without a path)."""
        if path is None:
            return 0
        tensors, state, meta = load_checkpoint(path)
        if meta.get("world_size", 1) != self.acc.num_processes:
            raise UserError(
                f"checkpoint {path} was written by {meta.get('world_size')} processes but this run has "
                f"{self.acc.num_processes}; resume with the same world size (the timestep / noise generators are "
                "per (seed, step, rank), so only then does the run continue exactly), or start a new run from its "
                "export (docs/multi-gpu.md, 'Resuming')."
            )
        self.state.check_shapes(path, tensors)
        self.state.load_weights(tensors)
        self.state.task.after_resume()  # e.g. inference copies re-merged from the restored weights
        self.state.load_optimizer(state)
        step = int(meta["step"])
        for component in self.components:
            component.restore(path, step)
        return step

    def from_main(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a barrier too)."""
        if self.acc.num_processes == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]
