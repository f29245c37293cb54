"""The Task protocol: what a post-training method supplies to the shared runner (runner.py).

A task owns its data source (dataset or rollouts) and its objective; the runner owns the loop (accumulation,
clipping, optimizer, LR schedule, EMA, checkpoints, validation, logging). The runner touches a task only through
what `Task` declares here: its attributes (`adapter`, `train_dataset`, `run_dir`), the model set-up and state
methods, `launch_check`, `micro_batches` / `objective` / `collect_metrics`, and the hooks. Micro-batches are each
method's typed dicts (`NFTBatch`, `GRPOBatch`, ...; the runner only passes them back to `objective`). Tasks never
branch on the model family.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.core.lora import add_lora_adapters, diffusers_lora_state_dict, lora_parameters
from sanarl.errors import ConfigError
from sanarl.models.base import DiffusionAdapter
from sanarl.training.distributed import load_full_state


def per_rank_batch(cfg: Config, world: int) -> int:
    """`train_batch_per_replica / world`, checked to split into whole micro-batches on every rank."""
    bpr, mb = cfg.train.train_batch_per_replica, cfg.train.train_policy.mini_batch
    if bpr % world or (bpr // world) % mb:
        raise ConfigError(
            f"`train.train_batch_per_replica = {bpr}` must split over {world} rank(s) into whole micro-batches of "
            f"`train.train_policy.mini_batch = {mb}` (needs a multiple of {world * mb}); set "
            f"train_batch_per_replica to {max(1, bpr // (world * mb)) * world * mb} or change mini_batch."
        )
    return bpr // world


def planned_steps(cfg: Config, per_epoch: int) -> int:
    """Optimizer steps of the run: `train.epoch` epochs of `per_epoch` steps, capped by `train.max_num_steps`."""
    total = cfg.train.epoch * per_epoch
    return min(total, cfg.train.max_num_steps) if cfg.train.max_num_steps is not None else total


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

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin, *, rank: int = 0, world: int = 1
    ) -> None:
        self.cfg = cfg
        self.adapter = adapter
        self.plugin = plugin
        self.rank = rank
        self.world = world
        self.uses_lora = cfg.policy.lora is not None
        self.run_dir = None

    # --- model setup --------------------------------------------------------------------------------------------
    def setup_model(self) -> None:
        """Freeze the base; add LoRA adapters when `[policy.lora]` is present, else train the whole transformer."""
        module = self.adapter.trainable_module()
        lora = self.cfg.policy.lora
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
        if self.cfg.policy.model_gradient_checkpointing and hasattr(module, "enable_gradient_checkpointing"):
            module.enable_gradient_checkpointing()
        module.train()

    def per_rank_batch(self) -> int:
        """Samples per optimizer step on this rank: `train_batch_per_replica` is the batch of the whole replica
        (all data-parallel ranks, as in Cosmos-RL), split evenly across ranks."""
        return per_rank_batch(self.cfg, self.world)

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

    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """Hook after each optimizer step (e.g. old-adapter decay); returns extra metrics."""
        return {}

    def after_resume(self) -> None:  # noqa: B027  (optional hook, deliberately a no-op by default)
        """Hook after a checkpoint's weights are loaded: rebuild whatever was derived from the weights at set-up
        (e.g. NFT's inference copies of the old adapter)."""

    def _validation_dataset(self):
        """The plugin's validation set, else the training set."""
        dataset = self.plugin.get_val_dataset(self.cfg) if hasattr(self.plugin, "get_val_dataset") else None
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
