"""The Task protocol: what a post-training method supplies to the shared runner (runner.py).

A task owns its data source (dataset or rollouts) and its objective; the runner owns the loop (accumulation,
clipping, optimizer, LR schedule, EMA, checkpoints, validation, logging). The runner touches a task only through
what `Task` declares here: its attributes (`adapter`, `train_dataset`, `run_dir`), the model set-up and state
methods, `launch_check`, `micro_batches` / `objective` / `collect_metrics`, and the hooks. Micro-batches are each
method's typed dicts (`NFTBatch`, `GRPOBatch`, ...; the runner only passes them back to `objective`). Tasks never
branch on the model family.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.schema import Config, LoraConfig
from sanarl.core.lora import add_lora_adapters, diffusers_lora_state_dict, lora_parameters
from sanarl.errors import ConfigError, DataError
from sanarl.models.base import DiffusionAdapter
from sanarl.training.distributed import load_full_state


@dataclass(frozen=True)
class RunSettings:
    """The run-level keys every task reads (from `[train]`, `[train.train_policy]`, `[policy]` and `[logging]`);
    each method reads its own sections through its config view (`sanarl/methods/<method>/config.py`)."""

    seed: int
    batch_per_replica: int
    """`train.train_batch_per_replica`: the samples of one optimizer step over all data-parallel ranks."""
    mini_batch: int
    """`train.train_policy.mini_batch`: the samples of one micro-batch (one backward pass)."""
    epoch: int
    max_num_steps: int | None
    max_wall_minutes: float | None
    param_dtype: str
    compile: bool
    """`train.compile`: torch.compile the trained transformer's forward (training's and the rollout's calls)."""
    lora: LoraConfig | None
    """`[policy.lora]`, None for a full fine-tune."""
    gradient_checkpointing: bool
    grid_every: int
    """`logging.multi_modal_log_interval`: save a rollout grid every this many steps (0 = never)."""


def run_settings(cfg: Config) -> RunSettings:
    train = cfg.train
    return RunSettings(
        seed=train.seed,
        batch_per_replica=train.train_batch_per_replica,
        mini_batch=train.train_policy.mini_batch,
        epoch=train.epoch,
        max_num_steps=train.max_num_steps,
        max_wall_minutes=train.max_wall_minutes,
        param_dtype=train.param_dtype,
        compile=train.compile,
        lora=cfg.policy.lora,
        gradient_checkpointing=cfg.policy.model_gradient_checkpointing,
        grid_every=cfg.logging.multi_modal_log_interval,
    )


def per_rank_batch(run: RunSettings, world: int) -> int:
    """`train_batch_per_replica / world`, checked to split into whole micro-batches on every rank."""
    bpr, mb = run.batch_per_replica, run.mini_batch
    if bpr % world or (bpr // world) % mb:
        raise ConfigError(
            f"`train.train_batch_per_replica = {bpr}` must split over {world} rank(s) into whole micro-batches of "
            f"`train.train_policy.mini_batch = {mb}` (needs a multiple of {world * mb}); set "
            f"train_batch_per_replica to {max(1, bpr // (world * mb)) * world * mb} or change mini_batch."
        )
    return bpr // world


def planned_steps(run: RunSettings, per_epoch: int) -> int:
    """Optimizer steps of the run: `train.epoch` epochs of `per_epoch` steps, capped by `train.max_num_steps`."""
    total = run.epoch * per_epoch
    return min(total, run.max_num_steps) if run.max_num_steps is not None else total


def steps_plan(run: RunSettings, per_epoch: int, per_epoch_note: str = "") -> str:
    """The plan's "steps" row: epochs x steps per epoch, the optimizer steps that gives and what ends the run
    (`train.max_num_steps` only caps: with fewer steps in the epochs, the epochs end it)."""
    epochs = run.epoch * per_epoch
    total = planned_steps(run, per_epoch)
    if run.max_num_steps is not None and run.max_num_steps < epochs:
        stop = f"train.max_num_steps = {run.max_num_steps} ends the run"
    elif run.max_num_steps == epochs:
        stop = f"the epochs and train.max_num_steps = {epochs} end the run together"
    elif run.max_num_steps is not None:
        stop = (
            f"the epochs end the run before train.max_num_steps = {run.max_num_steps} (it only caps; raise "
            "train.epoch to run longer)"
        )
    else:
        stop = "the epochs end the run (train.max_num_steps would stop it sooner)"
    if run.max_wall_minutes is not None:
        stop += f", or train.max_wall_minutes = {run.max_wall_minutes:g} if that comes first"
    return f"{per_epoch} per epoch{per_epoch_note} x {run.epoch} epoch(s) -> {total} optimizer steps; {stop}"


def load_train_dataset(cfg: Config, plugin: DatasetPlugin) -> Dataset:
    """The plugin's training dataset, checked non-empty (DataError naming the plugin and the key)."""
    dataset = plugin.get_dataset(cfg)
    if len(dataset) == 0:
        raise DataError(
            f"the dataset of plugin `{plugin.__name__}` is empty; check train.train_policy.dataset."
        )
    return dataset


class Task(ABC):
    """Base of SFT / NFT / GRPO / SOAR tasks."""

    lora_names: tuple[str, ...] = ("default",)
    """LoRA adapters the method needs besides `[policy.lora].lora_names` (NFT: "old")."""
    train_dataset: Dataset
    """The method's data source (images for SFT / SOAR, prompts for RL), set by the subclass's constructor; the
    plan (`describe`) and the epoch length read its size."""
    run_dir: Path | None
    """The run's output directory, set by the runner before training (rollout grids go under it); None outside a
    run."""
    run: RunSettings
    """The run-level keys (seed, batch, LoRA, ...); the method's own sections are its `view`."""

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin, *, rank: int = 0, world: int = 1
    ) -> None:
        # the whole config is read here only, to pick the run-level keys and to hand the plugin its datasets (the
        # plugin API takes the config); everything after construction reads `run` and the method's view
        self.run = run_settings(cfg)
        self.adapter = adapter
        self.plugin = plugin
        self.rank = rank
        self.world = world
        self.uses_lora = self.run.lora is not None
        self.run_dir = None
        get_val = getattr(plugin, "get_val_dataset", None)
        # built on first use and kept: a run without validation never builds it
        self._val_dataset = functools.cache(lambda: get_val(cfg) if get_val is not None else None)

    # --- model setup --------------------------------------------------------------------------------------------
    def setup_model(self) -> None:
        """Freeze the base; add LoRA adapters when `[policy.lora]` is present, else train the whole transformer."""
        module = self.adapter.trainable_module()
        lora = self.run.lora
        if lora is None:
            module.requires_grad_(True)
        else:
            module.requires_grad_(False)
            names = list(dict.fromkeys([*lora.lora_names, *self.lora_names]))
            add_lora_adapters(
                module,
                names,
                r=lora.r,
                alpha=lora.lora_alpha,
                init=lora.init_lora_weights,
                target_modules=lora.target_modules or list(self.adapter.default_lora_targets),
                dropout=lora.lora_dropout,
            )
        if self.run.gradient_checkpointing and hasattr(module, "enable_gradient_checkpointing"):
            module.enable_gradient_checkpointing()
        module.train()

    def per_rank_batch(self) -> int:
        """Samples per optimizer step on this rank: `train_batch_per_replica` is the batch of the whole replica
        (all data-parallel ranks, as in Cosmos-RL), split evenly across ranks."""
        return per_rank_batch(self.run, self.world)

    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.adapter.trainable_module().named_parameters() if p.requires_grad]

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint must hold of the model: all LoRA adapters, or the full transformer."""
        module = self.adapter.trainable_module()
        if self.uses_lora:
            return {k: v.detach() for k, v in lora_parameters(module).items()}
        return module.state_dict()

    @torch.no_grad()
    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        unexpected = load_full_state(self.adapter.trainable_module(), tensors)
        expected = set(self.state_tensors())
        lost = [k for k in expected if k not in tensors]
        if lost or unexpected:
            raise ValueError(
                f"checkpoint does not match the model: missing {lost[:4]}, unexpected {unexpected[:4]}"
            )

    def export(self, directory: Path) -> None:
        """LoRA -> diffusers LoRA file (`load_lora_weights`); full fine-tune -> pipeline dir (`from_pretrained`)."""
        if self.uses_lora:
            state = diffusers_lora_state_dict(self.adapter.trainable_module(), "default")
            self.adapter.save_lora(directory, state)
        else:
            self.adapter.save_pipeline(directory)

    def launch_check(self, fsdp: bool) -> None:  # noqa: B027  (optional hook, deliberately a no-op by default)
        """Raise ConfigError when the method cannot run under this launch (`fsdp`: parameters sharded by FSDP);
        called by the runner once the model is wrapped, before the first step."""

    # --- the method ---------------------------------------------------------------------------------------------
    @abstractmethod
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one pass over the data (or one epoch of prompts)."""

    @abstractmethod
    def micro_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """The micro-batches of optimizer step `step` on this rank (SFT: data; RL: a rollout)."""

    @abstractmethod
    def objective(self, batch: dict, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss of one micro-batch (before division by the number of micro-batches) and its metrics."""

    def collect_metrics(self) -> dict[str, float]:
        """Metrics the last `micro_batches` call produced (RL: rewards, rollout timings); default none."""
        return {}

    def close(self) -> None:  # noqa: B027  (optional hook, deliberately a no-op by default)
        """Release background resources (reward workers)."""

    def sample_batches(self, micro: list[dict]) -> int:
        """How many sample batches the micro-batches `micro` of one optimizer step hold (the EMA's
        `ema_update_per = "sample_batch"` counts them); default: each micro-batch is one."""
        return max(1, len(micro))

    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """Hook after each optimizer step (e.g. old-adapter decay); returns extra metrics."""
        return {}

    def after_resume(self) -> None:  # noqa: B027  (optional hook, deliberately a no-op by default)
        """Hook after a checkpoint's weights are loaded: rebuild whatever was derived from the weights at set-up
        (e.g. NFT's inference copies of the old adapter)."""

    def _validation_dataset(self):
        """The plugin's validation set, else the training set."""
        dataset = self._val_dataset()
        return dataset if dataset is not None else self.train_dataset

    def validation_prompts(self, count: int) -> list[str]:
        """Prompts for validation grids: the plugin's validation set, else the first training prompts."""
        dataset = self._validation_dataset()
        return [dataset[i]["prompt"] for i in range(min(count, len(dataset)))]

    def validation_metadata(self, count: int) -> list[dict]:
        """Metadata of the rows `validation_prompts` uses, {} where an item has none."""
        dataset = self._validation_dataset()
        return [dict(dataset[i].get("metadata") or {}) for i in range(min(count, len(dataset)))]

    @staticmethod
    @abstractmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """(label, value) rows of the run's arithmetic, computed without a model (`sanarl validate`)."""
