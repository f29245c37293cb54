"""DiffusionNFT: online RL on the forward process (docs/algorithms.md, "DiffusionNFT"; arXiv 2509.16117).

Per optimizer step ("iteration"): roll out K samples per prompt with the old adapter (CFG-free ODE by default),
score them, turn rewards into per-prompt advantages, then for every kept sample train on
int(N * timesteps_fraction) distinct levels of the rollout grid with the NFT loss (sanarl.core.nft_loss). After
the optimizer step the old adapter decays toward the trained one and the inference copies are refreshed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from sanarl.config.schema import Config
from sanarl.core.advantages import PerPromptStatTracker
from sanarl.core.ema import decay_old_weights, old_weight_decay
from sanarl.core.flow import interpolate, sigma_grid
from sanarl.core.lora import adapter_parameters, adapters_disabled, using_adapter
from sanarl.core.media import save_media
from sanarl.core.nft_loss import nft_loss
from sanarl.errors import ConfigError, DataError
from sanarl.models.base import Cond
from sanarl.rewards.combine import RewardResult
from sanarl.tasks.base import Task, per_rank_batch
from sanarl.tasks.data import step_indices
from sanarl.tasks.rollout import PromptGroup, RolloutEngine, group_seeds

log = logging.getLogger(__name__)


def prompts_per_rank(cfg: Config, world: int) -> int:
    return per_rank_batch(cfg, world) // cfg.rollout.n_generation


def load_prompt_dataset(cfg: Config, plugin, world: int):
    """The plugin's prompt dataset for a group-based RL task, checked non-empty and with whole prompt groups on
    every rank."""
    dataset = plugin.get_dataset(cfg)
    if len(dataset) == 0:
        raise DataError("the prompt dataset is empty; check train.train_policy.dataset.")
    k = cfg.rollout.n_generation
    if per_rank_batch(cfg, world) % k:
        raise ConfigError(
            f"each rank trains on {per_rank_batch(cfg, world)} samples per step, not a multiple of the group size "
            f"rollout.n_generation = {k}; set train.train_batch_per_replica to a multiple of {k * world}."
        )
    return dataset


class NFTTask(Task):
    """The `grpo` / `diffusion_nft` task."""

    lora_names = ("default", "old")

    def __init__(self, cfg: Config, adapter, plugin, *, rank: int = 0, world: int = 1) -> None:
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        if cfg.policy.lora is None:
            raise ConfigError(
                "trainer_type = 'diffusion_nft' trains a LoRA adapter against an 'old' one; add a [policy.lora] "
                'table (e.g. r = 4, lora_alpha = 4, lora_names = ["default", "old"]).'
            )
        self.train_dataset = load_prompt_dataset(cfg, plugin, world)
        self.tracker = PerPromptStatTracker(global_std=cfg.train.train_policy.global_std)
        self.engine: RolloutEngine | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_groups: list[PromptGroup] = []
        self.run_dir: Path | None = None
        self._pending: tuple[int, list[dict]] | None = None
        check_steps_per_rollout(cfg)

    def setup_model(self) -> None:
        super().setup_model()
        self.engine = RolloutEngine(self.cfg, self.adapter, self.uses_lora)

    def steps_per_epoch(self) -> int:
        prompts_per_step = self.cfg.train.train_batch_per_replica // self.cfg.rollout.n_generation
        rollouts = max(1, len(self.train_dataset) // prompts_per_step)
        return rollouts * self.cfg.train.train_policy.optimizer_steps_per_rollout

    # --- rollout and advantages ---------------------------------------------------------------------------------
    def _step_prompts(self, step: int) -> tuple[list[str], list[dict]]:
        idx = step_indices(
            len(self.train_dataset),
            self.cfg.train.seed,
            step,
            rank=self.rank,
            world=self.world,
            per_rank=prompts_per_rank(self.cfg, self.world),
        )
        items = [self.train_dataset[i] for i in idx]
        return [it["prompt"] for it in items], [it.get("metadata", {}) for it in items]

    def _group_seeds(self, step: int, count: int, per_group: int) -> list[list[int]]:
        """Sample seeds of this rank's `count` prompt groups, keyed by each group's global position in the step
        (rank r holds positions r * count ... r * count + count - 1, as in `step_indices`): ranks draw disjoint
        noise, and W ranks roll out exactly what one rank with the whole batch would."""
        first = self.rank * count
        return [group_seeds(self.cfg.train.seed, step, 0, first + p, per_group) for p in range(count)]

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
        adv = torch.zeros_like(all_rewards)
        kept_prompts = [p for p, k in zip(all_prompts, all_keep.tolist(), strict=True) if k]
        adv[all_keep] = self.tracker.compute(kept_prompts, all_rewards[all_keep])
        n = len(rewards)
        mine = slice(self.rank * n, (self.rank + 1) * n)
        stats = {f"advantage/{k}": float(v) for k, v in self.tracker.stats().items()}
        stats["zero_std_ratio"] = stats.pop("advantage/zero_std_ratio", 0.0)
        return adv[mine], all_keep[mine], stats

    def micro_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """The micro-batches of optimizer step `step`. With `optimizer_steps_per_rollout` = k, rollout r serves
        optimizer steps r k ... r k + k - 1, each taking a k-th of the rollout's sample chunks with all their
        trained levels (`split_updates`; rollout metrics are reported on the step that samples)."""
        k = self.cfg.train.train_policy.optimizer_steps_per_rollout
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

    def _finish_chunk(self, batches: list[dict]) -> list[dict]:
        """The micro-batches of one optimizer step, as the runner gets them, weighted so that the step's loss is the
        mean over its (sample, level) rows whatever the chunking (after NaN drops the last chunk is shorter; its
        rows must not weigh more). With several ranks every rank must run as many backward passes (DDP / FSDP
        communicate in each), but NaN rewards can drop different numbers of samples per rank: pad with zero-weight
        micro-batches (zero latents, so even NaN rollouts pad safely)."""
        if self.world == 1:
            set_loss_weights(batches, len(batches))
            return batches
        from accelerate.utils import gather

        most = int(gather(torch.tensor([len(batches)], device=self.adapter.device)).max())
        set_loss_weights(batches, most)
        if most == len(batches):
            return batches
        group = self.last_groups[0]
        pad = {
            "x0": torch.zeros_like(group.latents[:1]),
            "cond": group.cond.select([0]),
            "t": torch.full((1,), 0.5),
            "eps": torch.zeros_like(group.latents[:1]),
            "adv": torch.zeros(1),
            "weight": 0.0,
        }
        return batches + [pad] * (most - len(batches))

    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out the prompts of rollout `step`, score them, and build all its training micro-batches."""
        prompts, metas = self._step_prompts(step)
        seeds = self._group_seeds(step, len(prompts), self.engine.m)
        module = self.adapter.trainable_module()
        module.eval()
        groups, metrics = self.engine.rollout(prompts, metas, seeds)
        module.train()
        adv, keep, stats = self._advantages(groups)
        metrics.update(stats)
        metrics.update(_reward_metrics(groups))
        self.last_metrics, self.last_groups = metrics, groups
        self._maybe_save_grid(step, groups)
        return self._training_batches(groups, adv, keep, rng)

    def _training_batches(
        self, groups: list[PromptGroup], adv: torch.Tensor, keep: torch.Tensor, rng: torch.Generator
    ) -> list[dict]:
        """One micro-batch per (chunk of mini_batch samples, trained level j); levels are random per sample."""
        x0 = torch.cat([g.latents for g in groups])[keep]
        cond = Cond.cat([g.cond.select([0] * len(g.seeds)) for g in groups]).select(keep.nonzero().squeeze(1))
        adv = adv[keep]
        num_steps = self.engine.spec.num_steps
        levels = sigma_grid(num_steps, self.engine.spec.shift)[:-1]
        trained = max(1, int(num_steps * self.cfg.policy.diffusers.timesteps_fraction))
        order = torch.stack([torch.randperm(num_steps, generator=rng)[:trained] for _ in range(len(x0))])
        eps = torch.randn((trained, *x0.shape), generator=rng)
        batches, mb = [], self.cfg.train.train_policy.mini_batch
        for start in range(0, len(x0), mb):
            rows = slice(start, start + mb)
            for j in range(trained):
                batches.append(
                    {
                        "x0": x0[rows],
                        "cond": cond.select(rows),
                        "t": levels[order[rows, j]],
                        "eps": eps[j, rows],
                        "adv": adv[rows],
                        "chunk": start // mb,
                    }
                )
        return batches

    def collect_metrics(self) -> dict[str, float]:
        return self.last_metrics

    # --- objective ----------------------------------------------------------------------------------------------
    def objective(self, batch: dict, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.adapter.device
        x0, t, eps = batch["x0"].to(device), batch["t"].to(device), batch["eps"].to(device)
        cond: Cond = batch["cond"].to(device)
        x_t = interpolate(x0, eps, t)
        module = self.adapter.trainable_module()
        with torch.no_grad(), using_adapter(module, "old"):
            v_old = self.adapter.velocity(x_t, t, cond)
        v_theta = self.adapter.velocity(x_t, t, cond)
        kl_beta = self.cfg.train.train_policy.kl_beta
        v_ref = None
        if kl_beta > 0:
            with torch.no_grad(), adapters_disabled(module):
                v_ref = self.adapter.velocity(x_t, t, cond)
        tp = self.cfg.train.train_policy
        loss, metrics = nft_loss(
            v_theta,
            v_old,
            x_t,
            x0,
            t,
            batch["adv"].to(device),
            beta=self.cfg.policy.diffusers.nft_beta,
            adv_clip_max=tp.advantage_high,
            v_ref=v_ref,
            kl_beta=kl_beta,
            adv_mode=tp.adv_mode,
        )
        loss = loss * batch.get("weight", 1.0)
        return loss, {"loss": loss.item(), **{k: float(v) for k, v in metrics.items()}}

    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """After the last optimizer step of a rollout (`step` = optimizer steps done): theta_old <- d theta_old +
        (1 - d) theta, d = decay(optimizer steps done, weight_copy_decay_type), counted in optimizer steps as
        DiffusionNFT's global step; refresh the inference copies."""
        k = self.cfg.train.train_policy.optimizer_steps_per_rollout
        if step % k:
            return {}
        module = self.adapter.trainable_module()
        decay = old_weight_decay(step, self.cfg.policy.diffusers.weight_copy_decay_type)
        old = adapter_parameters(module, "old")
        new = adapter_parameters(module, "default")
        pairs = [(old[k], new[k.replace(".old.", ".default.")]) for k in old]
        decay_old_weights([o for o, _ in pairs], [n.detach() for _, n in pairs], decay)
        self.engine.refresh()
        return {"old_decay": decay}

    def after_resume(self) -> None:
        """The inference copies were merged from the set-up weights: refresh them from the restored old adapter, so
        the first rollout after a resume samples from the same theta_old as an uninterrupted run."""
        self.engine.refresh()

    def _maybe_save_grid(self, step: int, groups: list[PromptGroup]) -> None:
        every = self.cfg.logging.multi_modal_log_interval
        if not every or step % every or self.rank != 0 or self.run_dir is None:
            return
        shown = groups[: max(1, 32 // max(1, len(groups[0].seeds)))]
        images = torch.cat([g.images for g in shown])[:32]
        captions = [f"{g.prompt} | r={r:.3f}" for g in shown for r in g.reward.total.tolist()][:32]
        save_media(
            images, captions, self.run_dir / "rollouts" / f"step_{step:08d}"
        )  # .png, or .mp4 for clips

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The Cosmos-RL arithmetic: prompts x group per rank, micro-batches, trained levels."""
        k, bpr, mb = (
            cfg.rollout.n_generation,
            cfg.train.train_batch_per_replica,
            cfg.train.train_policy.mini_batch,
        )
        per_rank = per_rank_batch(cfg, world)
        steps = cfg.policy.diffusers.sample.num_steps
        trained = max(1, int(steps * cfg.policy.diffusers.timesteps_fraction))
        spr = cfg.train.train_policy.optimizer_steps_per_rollout
        per_epoch = max(1, dataset_size // (bpr // k)) * spr
        total = cfg.train.epoch * per_epoch
        if cfg.train.max_num_steps is not None:
            total = min(total, cfg.train.max_num_steps)
        ro = cfg.rollout
        m = ro.num_candidates or k
        rows = [
            ("prompts", f"{dataset_size} in the prompt set"),
            ("batch per step", f"{bpr} / {k} (n_generation) / {world} rank(s) = {per_rank // k} prompts x {k} images"
             f" = {per_rank} samples per rank"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank, x {trained} trained levels "
             f"(int({steps} x {cfg.policy.diffusers.timesteps_fraction})) = {(per_rank // mb) * trained} backward passes"),
            ("rollout", f"family {ro.family}: {m} drafts -> {k} kept per prompt, {steps} steps, guidance "
             f"{cfg.policy.diffusers.sample.guidance_scale}, solver {cfg.policy.diffusers.sample.solver}"),
            ("steps", f"{per_epoch} per epoch x {cfg.train.epoch} epoch(s) -> {total} optimizer steps"
             + (f" ({spr} per rollout, each on 1/{spr} of its micro-batches)" if spr > 1 else "")),
        ]  # fmt: skip
        if ro.family == "sol_rl":
            rows.append(("preview", f"{ro.preview_step} steps at {ro.preview_precision}"))
        return rows


def split_updates(batches: list[dict], k: int, rng: torch.Generator) -> list[list[dict]]:
    """A rollout's micro-batches for its k optimizer steps. As flow_grpo and DiffusionNFT, an update takes whole
    sample chunks with all their trained levels: the chunks (micro-batches sharing `chunk`) are shuffled and cut into
    k contiguous parts whose chunk counts differ by at most one."""
    if k == 1:
        return [batches]
    chunks: dict[int, list[dict]] = {}
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


def check_steps_per_rollout(cfg: Config) -> None:
    """`optimizer_steps_per_rollout` fits the rollout's micro-batches and the checkpoint cadence (ConfigError)."""
    tp, k = cfg.train.train_policy, cfg.train.train_policy.optimizer_steps_per_rollout
    if k < 1:
        raise ConfigError(
            f"train.train_policy.optimizer_steps_per_rollout = {k} must be >= 1 (1 = one update per rollout)."
        )
    chunks = max(1, cfg.train.train_batch_per_replica // max(1, tp.mini_batch))
    if k > chunks:
        raise ConfigError(
            f"train.train_policy.optimizer_steps_per_rollout = {k} exceeds the {chunks} sample chunks of a rollout "
            f"(train_batch_per_replica {cfg.train.train_batch_per_replica} / mini_batch {tp.mini_batch}); lower it "
            "or raise train_batch_per_replica."
        )
    ckpt = cfg.train.ckpt
    if k > 1 and ckpt.enable_checkpoint and ckpt.save_freq % k:
        raise ConfigError(
            f"train.ckpt.save_freq = {ckpt.save_freq} is not a multiple of optimizer_steps_per_rollout = {k}: a "
            "checkpoint inside a rollout cannot resume it exactly. Set save_freq to a multiple of "
            f"{k} (e.g. {k * max(1, round(ckpt.save_freq / k))})."
        )


def _reward_metrics(groups: list[PromptGroup]) -> dict[str, float]:
    """reward/mean, std, min, max, per key and dropped count over this rank's kept samples."""
    results = [g.reward for g in groups]
    merged = RewardResult(
        torch.cat([r.total for r in results]),
        {k: torch.cat([r.per_key[k] for r in results]) for k in results[0].per_key},
        torch.cat([r.nan_mask for r in results]),
        {k: sum(r.durations.get(k, 0.0) for r in results) for k in results[0].durations},
    )
    return merged.metrics("reward/")
