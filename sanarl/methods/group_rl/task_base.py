"""What DiffusionNFT and Flow-GRPO share: group-based online RL on a prompt stream (docs/algorithms.md, "DiffusionNFT"
and "Flow-GRPO").

Per rollout both draw this rank's prompts of the step, K explicit seeds per prompt (keyed by the prompt's global
position, so W ranks roll out what one rank with the whole batch would), score the samples, normalise rewards into
per-prompt advantages over every rank's samples, and cut the rollout's micro-batches into
`optimizer_steps_per_rollout` updates of whole sample chunks. With several ranks every rank must run as many
backward passes (DDP / FSDP communicate in each): the ranks agree on the largest micro-batch count and pad with
zero-weight batches. What differs, the rollout itself, the training batches and the objective, is each method's.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import torch

from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.group_rl_schema import GroupPolicy
from sanarl.config.schema import Config
from sanarl.core.advantages import PerPromptStatTracker
from sanarl.core.media import save_media
from sanarl.errors import ConfigError, DataError
from sanarl.methods.checked_task import CheckedTask
from sanarl.methods.group_rl.config import GroupRLView
from sanarl.methods.group_rl.rollout import PromptGroup, Rollouts, group_seeds, reward_function
from sanarl.methods.work import StepPlan
from sanarl.models.base import DiffusionAdapter
from sanarl.rewards.combine import RewardResult
from sanarl.training.data_order import step_indices
from sanarl.training.protocol import RunSettings, per_rank_batch, run_settings

log = logging.getLogger(__name__)


def prompts_per_rank(run: RunSettings, k: int, world: int) -> int:
    """Prompt groups each rank rolls out per step: its samples / the group size K."""
    return per_rank_batch(run, world) // k


def load_prompt_dataset(cfg: Config, plugin: DatasetPlugin, world: int):
    """The plugin's prompt dataset, checked non-empty and with whole prompt groups on every rank."""
    return checked_prompt_dataset(plugin.get_dataset(cfg), cfg, world)


def checked_prompt_dataset(dataset, cfg: Config, world: int):
    """`dataset`, checked non-empty and with whole prompt groups on every rank (DataError / ConfigError)."""
    if len(dataset) == 0:
        raise DataError("the prompt dataset is empty; check train.train_policy.dataset.")
    k, per_rank = cfg.rollout.n_generation, per_rank_batch(run_settings(cfg), world)
    if per_rank % k:
        raise ConfigError(
            f"each rank trains on {per_rank} samples per step, not a multiple of the group size "
            f"rollout.n_generation = {k}; set train.train_batch_per_replica to a multiple of {k * world}."
        )
    return dataset


class GroupRLTask(CheckedTask):
    """Base of the group-based RL tasks: prompt stream, group seeds, cross-rank advantages, updates per rollout,
    DDP padding, reward metrics. Subclasses supply `_rollout_batches` and `_padding_batch` (and the objective)."""

    view: GroupRLView[GroupPolicy]
    """What the method reads: its `[train.train_policy]` keys, `[rollout]`, `[policy.diffusers]`, `[policy.lora]`."""
    method_plan: Callable[[Config], StepPlan]
    """The method's plan function (its config.py `plan`), set as `staticmethod(plan)`."""
    plan: StepPlan
    """The levels each kept sample trains per rollout: the count the printed and the capacity plans show."""
    sampling_adapter: str = "old"
    """The LoRA adapter `Rollouts.rollout` samples with (DiffusionNFT's behaviour policy; AWM: "default")."""

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        self.plan = self.method_plan(cfg)
        self.train_dataset = self._load_dataset(cfg, plugin, world)
        tp = self.view.train_policy
        self.tracker = PerPromptStatTracker(global_std=tp.global_std, unbiased=tp.unbiased_std)
        self.rollouts: Rollouts | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_groups: list[PromptGroup] = []
        self._pending: tuple[int, list[list[dict]]] | None = None

    def _load_dataset(self, cfg: Config, plugin: DatasetPlugin, world: int):
        """The prompt stream's dataset (the plugin's RL items; DDRL reads its SFT items instead)."""
        return load_prompt_dataset(cfg, plugin, world)

    def setup_model(self) -> None:
        super().setup_model()
        v = self.view
        self.rollouts = Rollouts(
            v.rollout,
            v.diffusers,
            reward_function(v.train_policy.remote_reward, v.rollout, remote=v.train_policy.use_remote_reward),
            self.adapter,
            uses_lora=self.uses_lora,
            compile=self.run.compile,
            sampling_adapter=self.sampling_adapter,
        )

    def launch_check(self, fsdp: bool) -> None:
        if fsdp and self.rollouts is not None and self.rollouts.full_copy is not None:
            raise ConfigError(
                f"rollout.family = {self.view.rollout.family!r} samples from inference copies merged from the live "
                "LoRA weights, which FSDP shards; launch this preset with DDP (sanarl/data/accelerate/ddp_8gpu.yaml: "
                "LoRA fits every GPU) or use rollout.family = 'diffusionnft' / 'naive_scaling' under FSDP."
            )

    def steps_per_epoch(self) -> int:
        prompts_per_step = self.run.batch_per_replica // self.view.rollout.n_generation
        rollouts = max(1, len(self.train_dataset) // prompts_per_step)
        return rollouts * self.view.train_policy.optimizer_steps_per_rollout

    # --- prompts, seeds, advantages -----------------------------------------------------------------------------
    def _scored_rollout(self, step: int) -> tuple[list[PromptGroup], torch.Tensor, torch.Tensor]:
        """Roll out the prompts of rollout `step` (`self.rollouts`, the module in eval mode), score them and
        normalise their advantages over every rank's samples: (groups, advantages, kept rows). The step's metrics
        and groups are kept for logging and its sample grid is saved when due."""
        prompts, metas = self._step_prompts(step)
        seeds = self._group_seeds(step, len(prompts), self.rollouts.m)
        module = self.adapter.trainable_module()
        module.eval()
        groups, metrics = self.rollouts.rollout(prompts, metas, seeds)
        module.train()
        adv, keep, stats = self._advantages(groups)
        metrics.update(stats)
        metrics.update(reward_metrics(groups))
        self.last_metrics, self.last_groups = metrics, groups
        self._maybe_save_grid(step, groups)
        return groups, adv, keep

    def _step_prompts(self, step: int) -> tuple[list[str], list[dict]]:
        """This rank's prompts (and metadata) of rollout `step`: a pure function of (seed, step, rank)."""
        items = self._step_items(step)
        return [it["prompt"] for it in items], [it.get("metadata", {}) for it in items]

    def _step_items(self, step: int) -> list[dict]:
        """This rank's dataset items of rollout `step`, one per prompt group."""
        idx = step_indices(
            len(self.train_dataset),
            self.run.seed,
            step,
            rank=self.rank,
            world=self.world,
            per_rank=prompts_per_rank(self.run, self.view.rollout.n_generation, self.world),
        )
        return [self.train_dataset[i] for i in idx]

    def _group_seeds(self, step: int, count: int, per_group: int) -> list[list[int]]:
        """Sample seeds of this rank's `count` prompt groups, keyed by each group's global position in the step
        (rank r holds positions r * count ... r * count + count - 1, as in `step_indices`): ranks draw disjoint
        noise, and W ranks roll out exactly what one rank with the whole batch would."""
        first = self.rank * count
        return [group_seeds(self.run.seed, step, 0, first + p, per_group) for p in range(count)]

    def _advantages(self, groups: list[PromptGroup]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Per-sample advantages [N] and keep mask [N] (finite reward) over this step's samples of all ranks."""
        from accelerate.utils import gather, gather_object

        rewards = torch.cat([g.reward.total for g in groups])
        keep = ~torch.cat([g.reward.nan_mask for g in groups])
        prompts = [g.prompt for g in groups for _ in range(len(g.seeds))]
        if self.world > 1:
            all_rewards = gather(rewards.to(self.adapter.device)).cpu()
            all_keep = gather(keep.to(self.adapter.device)).cpu()
            all_prompts = gather_object(prompts)
        else:
            all_rewards, all_keep, all_prompts = rewards, keep, prompts
        # the per-prompt statistics see every rank's samples of a prompt; each rank keeps its own slice
        adv = torch.zeros_like(all_rewards)
        kept_prompts = [p for p, k in zip(all_prompts, all_keep.tolist(), strict=True) if k]
        adv[all_keep] = self.tracker.compute(kept_prompts, all_rewards[all_keep])
        n = len(rewards)
        mine = slice(self.rank * n, (self.rank + 1) * n)
        stats = {f"advantage/{k}": float(v) for k, v in self.tracker.stats().items()}
        stats["zero_std_ratio"] = stats.pop("advantage/zero_std_ratio", 0.0)
        return adv[mine], all_keep[mine], stats

    # --- micro-batches of an optimizer step ---------------------------------------------------------------------
    def micro_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """The micro-batches of optimizer step `step`. With `optimizer_steps_per_rollout` = k, rollout r serves
        optimizer steps r k ... r k + k - 1, each taking a k-th of the rollout's sample chunks with all their
        trained levels (`split_updates`; rollout metrics are reported on the step that samples)."""
        k = self.view.train_policy.optimizer_steps_per_rollout
        rollout_step, part = divmod(step, k)
        if part == 0 or self._pending is None or self._pending[0] != rollout_step:
            if part != 0:
                log.warning(
                    "resuming inside rollout %d (optimizer step %d of its %d): re-sampling that rollout with the "
                    "current policy (keep train.ckpt.save_freq a multiple of %d to avoid this).",
                    rollout_step,
                    part + 1,
                    k,
                    k,
                )
            self._pending = (rollout_step, split_updates(self._rollout_batches(rollout_step, rng), k, rng))
        else:
            self.last_metrics = {}
        return self._finish_chunk(self._pending[1][part])

    def sample_batches(self, micro: list[dict]) -> int:
        """The sample chunks among `micro` (each trains all its steps or levels in several micro-batches; DDP
        padding is none)."""
        return max(1, len({b["chunk"] for b in micro if b["chunk"] >= 0}))

    def _finish_chunk(self, batches: list[dict]) -> list[dict]:
        """The micro-batches of one optimizer step as the runner gets them: padded to the ranks' common count with
        zero-weight batches, and weighted so that the step's loss is the mean over its rows whatever the chunking
        (after NaN drops the last chunk is shorter; its rows must not weigh more)."""
        most = len(batches)
        if self.world > 1:
            from accelerate.utils import gather

            most = int(gather(torch.tensor([len(batches)], device=self.adapter.device)).max())
        set_loss_weights(batches, most)
        return batches + [self._padding_batch() for _ in range(most - len(batches))]

    @abstractmethod
    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out rollout `step`, score it, and build all its training micro-batches (each with a `chunk`)."""

    @abstractmethod
    def _padding_batch(self) -> dict:
        """A zero-weight micro-batch of this rank's rollout (safe even for NaN rollouts) for DDP padding."""

    def collect_metrics(self) -> dict[str, float]:
        return self.last_metrics

    def _maybe_save_grid(self, step: int, groups: list[PromptGroup]) -> None:
        every = self.run.grid_every
        if not every or step % every or self.rank != 0 or self.run_dir is None:
            return
        shown = groups[: max(1, 32 // max(1, len(groups[0].seeds)))]
        images = torch.cat([g.images for g in shown])[:32]
        label = self.reward_label()
        captions = [f"{g.prompt} | {label}={r:.3f}" for g in shown for r in g.reward.total.tolist()][:32]
        title = f"step {step}: rollouts, {label} under each sample"
        save_media(
            images, captions, self.run_dir / "rollouts" / f"step_{step:08d}", title=title
        )  # .png, or .mp4 for clips

    def reward_label(self) -> str:
        """The name of the reward a rollout grid prints: the one reward's name, or `reward` (the combined
        reward of several, as `reward/mean` logs it)."""
        fns = self.view.train_policy.remote_reward.reward_fns
        return fns[0].name if len(fns) == 1 else "reward"

    def close(self) -> None:
        if self.rollouts is not None:
            self.rollouts.close()


def split_updates(batches: list[Mapping[str, Any]], k: int, rng: torch.Generator) -> list[list]:
    """A rollout's micro-batches for its k optimizer steps. As flow_grpo and DiffusionNFT, an update takes whole
    sample chunks with all their trained levels: the chunks (micro-batches sharing `chunk`) are shuffled and cut into
    k contiguous parts whose chunk counts differ by at most one."""
    if k == 1:
        return [batches]
    chunks: dict[int, list] = {}
    for batch in batches:
        chunks.setdefault(batch["chunk"], []).append(batch)
    groups = list(chunks.values())
    order = torch.randperm(len(groups), generator=rng).tolist()
    return [[b for group in part for b in group] for part in split_even([groups[i] for i in order], k)]


def split_even(items: list, parts: int) -> list[list]:
    """`items` cut into `parts` contiguous chunks whose sizes differ by at most one (earlier chunks larger)."""
    size, extra = divmod(len(items), parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + size + (1 if p < extra else 0))
    return [items[bounds[p] : bounds[p + 1]] for p in range(parts)]


def set_loss_weights(batches: list[dict], num_micro: int) -> None:
    """Give each micro-batch b (`adv` of n_b rows) the weight w_b = n_b * num_micro / sum_b n_b.

    The runner backpropagates sum_b w_b L_b / num_micro (L_b the mean over b's rows; `num_micro` counts zero-weight
    padding too), which then equals the mean over every (sample, trained step) row even when chunks are uneven.
    """
    rows = sum(len(b["adv"]) for b in batches)
    for b in batches:
        b["weight"] = len(b["adv"]) * num_micro / rows


def reward_metrics(groups: list[PromptGroup]) -> dict[str, float]:
    """reward/mean, std, min, max, per key and dropped count over this rank's kept samples."""
    results = [g.reward for g in groups]
    merged = RewardResult(
        torch.cat([r.total for r in results]),
        {k: torch.cat([r.per_key[k] for r in results]) for k in results[0].per_key},
        torch.cat([r.nan_mask for r in results]),
        {k: sum(r.durations.get(k, 0.0) for r in results) for k in results[0].durations},
    )
    return merged.metrics("reward/")
