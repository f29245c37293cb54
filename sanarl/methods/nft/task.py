"""DiffusionNFT: online RL on the forward process (docs/algorithms.md, "DiffusionNFT"; arXiv 2509.16117).

One iteration (optimizer step; `optimizer_steps_per_rollout` > 1 spreads a rollout over several):
  1. rollout: K samples per prompt with the old adapter (CFG-free ODE by default, or a Sol-RL family), scored;
  2. advantages: rewards -> per-prompt normalised advantages over every rank's samples (group_rl/task_base.py);
  3. batches: every kept sample trains int(N * timesteps_fraction) distinct levels of the rollout grid, fresh
     noise per level, one micro-batch per (chunk of mini_batch samples, level);
  4. objective: the NFT loss on v_theta against v_old (sanarl/core/nft_loss.py), plus the optional KL to the base;
  5. after the step: the old adapter decays toward the trained one and the inference copies are refreshed.
"""

from __future__ import annotations

from typing import TypedDict

import torch

from sanarl.config.schema import Config
from sanarl.core.flow import interpolate
from sanarl.core.lora import adapter_parameters, adapters_disabled, using_adapter
from sanarl.core.nft_loss import nft_loss
from sanarl.methods.group_rl.quantize import model_quant_plan
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.group_rl.task_base import GroupRLTask
from sanarl.methods.nft.config import NFTView, plan, view
from sanarl.models.base import Cond
from sanarl.training.ema import decay_old_weights, old_weight_decay
from sanarl.training.protocol import per_rank_batch, run_settings, steps_plan


class _NFTRows(TypedDict):
    x0: torch.Tensor
    """[B, ...] the rollout's final latents."""
    cond: Cond
    t: torch.Tensor
    """[B] the trained level of each row (a point of the rollout grid)."""
    eps: torch.Tensor
    """[B, ...] fresh noise: x_t = (1 - t) x0 + t eps."""
    adv: torch.Tensor
    """[B] advantages."""
    chunk: int
    """Index of the sample chunk (an update takes whole chunks, group_rl.task_base.split_updates)."""


class NFTBatch(_NFTRows, total=False):
    """One NFT micro-batch: `mini_batch` kept samples at one trained level each."""

    weight: float
    """Loss weight (group_rl.task_base.set_loss_weights; 0 for DDP padding)."""


class NFTTask(GroupRLTask):
    """The `grpo` / `diffusion_nft` task."""

    lora_names = ("default", "old")
    view: NFTView
    method_view = staticmethod(view)
    method_plan = staticmethod(plan)

    # --- 1-3: rollout, advantages, batches -------------------------------------------------------------------
    def _padding_batch(self) -> NFTBatch:
        """Zero latents, so even NaN rollouts pad safely."""
        group = self.last_groups[0]
        zeros = torch.zeros_like(group.latents[:1])
        return NFTBatch(x0=zeros, cond=group.cond.select([0]), t=torch.full((1,), 0.5), eps=zeros.clone(),
                        adv=torch.zeros(1), chunk=-1, weight=0.0)  # fmt: skip

    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out the prompts of rollout `step`, score them, and build all its training micro-batches."""
        # 1. rollout: this rank's prompt groups with the old adapter, scored; 2. advantages over every rank's samples
        groups, adv, keep = self._scored_rollout(step)
        return self._training_batches(groups, adv, keep, rng)

    def _training_batches(
        self, groups: list[PromptGroup], adv: torch.Tensor, keep: torch.Tensor, rng: torch.Generator
    ) -> list[NFTBatch]:
        """3. One micro-batch per (chunk of mini_batch samples, trained level j); levels are random per sample."""
        x0 = torch.cat([g.latents for g in groups])[keep]
        cond = Cond.cat([g.cond.select([0] * len(g.seeds)) for g in groups]).select(keep.nonzero().squeeze(1))
        adv = adv[keep]
        num_steps = self.rollouts.spec.num_steps
        levels = self.rollouts.spec.sigmas(self.adapter)[:-1]  # the rollout's own grid
        trained = self.plan.levels
        order = torch.stack([torch.randperm(num_steps, generator=rng)[:trained] for _ in range(len(x0))])
        eps = torch.randn((trained, *x0.shape), generator=rng)
        batches, mb = [], self.run.mini_batch
        for start in range(0, len(x0), mb):
            rows = slice(start, start + mb)
            for j in range(trained):
                batches.append(
                    NFTBatch(
                        x0=x0[rows],
                        cond=cond.select(rows),
                        t=levels[order[rows, j]],
                        eps=eps[j, rows],
                        adv=adv[rows],
                        chunk=start // mb,
                    )
                )
        return batches

    # --- 4. objective -------------------------------------------------------------------------------------------
    def objective(self, batch: NFTBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.adapter.device
        x0, t, eps = batch["x0"].to(device), batch["t"].to(device), batch["eps"].to(device)
        cond: Cond = batch["cond"].to(device)
        x_t = interpolate(x0, eps, t)
        module = self.adapter.trainable_module()
        with torch.no_grad(), using_adapter(module, "old"):
            v_old = self.adapter.velocity(x_t, t, cond)
        v_theta = self.adapter.velocity(x_t, t, cond)
        tp = self.view.train_policy
        kl_beta = tp.kl_beta
        v_ref = None
        if kl_beta > 0:
            with torch.no_grad(), adapters_disabled(module):
                v_ref = self.adapter.velocity(x_t, t, cond)
        loss, metrics = nft_loss(
            v_theta,
            v_old,
            x_t,
            x0,
            t,
            batch["adv"].to(device),
            beta=self.view.diffusers.nft_beta,
            adv_clip_max=tp.advantage_high,
            v_ref=v_ref,
            kl_beta=kl_beta,
            adv_mode=tp.adv_mode,
        )
        loss = loss * batch.get("weight", 1.0)
        return loss, {"loss": loss.item(), **{k: float(v) for k, v in metrics.items()}}

    # --- 5. after the step ---------------------------------------------------------------------------------------
    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """After the last optimizer step of a rollout (`step` = optimizer steps done): theta_old <- d theta_old +
        (1 - d) theta, d = decay(optimizer steps done, weight_copy_decay_type), counted in optimizer steps as
        DiffusionNFT's global step; refresh the inference copies."""
        k = self.view.train_policy.optimizer_steps_per_rollout
        if step % k:
            return {}
        module = self.adapter.trainable_module()
        diff = self.view.diffusers
        decay = old_weight_decay(
            step, diff.weight_copy_decay_type, diff.custom_decay_step, diff.custom_decay_value
        )
        old = adapter_parameters(module, "old")
        new = adapter_parameters(module, "default")
        pairs = [(old[k], new[k.replace(".old.", ".default.")]) for k in old]
        decay_old_weights([o for o, _ in pairs], [n.detach() for _, n in pairs], decay)
        self.rollouts.refresh()
        return {"old_decay": decay}

    def after_resume(self) -> None:
        """The inference copies were merged from the set-up weights: refresh them from the restored old adapter, so
        the first rollout after a resume samples from the same theta_old as an uninterrupted run."""
        self.rollouts.refresh()

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The Cosmos-RL arithmetic: prompts x group per rank, micro-batches, trained levels."""
        v, run = view(cfg), run_settings(cfg)
        ro, sample = v.rollout, v.diffusers.sample
        k, bpr, mb = ro.n_generation, run.batch_per_replica, run.mini_batch
        per_rank = per_rank_batch(run, world)
        steps, trained = sample.num_steps, plan(cfg)
        spr = v.train_policy.optimizer_steps_per_rollout
        per_epoch = max(1, dataset_size // (bpr // k)) * spr
        m = ro.num_candidates or k
        rows = [
            ("prompts", f"{dataset_size} in the prompt set"),
            ("batch per step", f"{bpr} / {k} (n_generation) / {world} rank(s) = {per_rank // k} prompts x {k} images"
             f" = {per_rank} samples per rank"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank, x {trained.levels} trained levels "
             f"({trained.rule}) = {(per_rank // mb) * trained.levels} backward passes"),
            ("rollout", f"family {ro.family}: {m} drafts -> {k} kept per prompt, {steps} steps, guidance "
             f"{sample.guidance_scale}, solver {sample.solver}"),
            ("steps", steps_plan(run, per_epoch)
             + (f" ({spr} per rollout, each on 1/{spr} of its micro-batches)" if spr > 1 else "")),
        ]  # fmt: skip
        if ro.family == "sol_rl":
            rows.append(("preview", f"{ro.preview_step} steps at {ro.preview_precision}"))
        if ro.family in ("naive_quant", "sol_rl") and ro.preview_precision != "bf16":
            rows.append(("quantized copy", _quantized_copy_row(cfg, ro)))
        return rows


def _quantized_copy_row(cfg: Config, ro) -> str:
    """What the quantized copy replaces, from the architecture on the meta device (no weights); refuses (UserError)
    a copy that would quantize nothing."""
    name = cfg.policy.model_name_or_path
    what = f'`rollout.family = "{ro.family}"` with `rollout.preview_precision = "{ro.preview_precision}"`'
    plan = model_quant_plan(name, cfg.policy.model_revision, ro.nvfp4_min_dim, what)
    if plan is None:
        return f"layers counted once the transformer config of {name} is here"
    return plan.summary()
