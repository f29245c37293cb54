"""AWM, Advantage Weighted Matching: online RL as flow matching on the policy's own samples (docs/algorithms.md,
"AWM"; arXiv 2509.25050, scxue/advantage_weighted_matching).

One rollout (served over `optimizer_steps_per_rollout` optimizer steps):
  1. rollout: K samples per prompt with the policy itself (any sampler of `policy.diffusers.sample`: the loss reads
     only the final latents x0), scored;
  2. advantages: per-prompt normalised over every rank's samples (group_rl/task_base.py), clipped to [-C, C] and
     scaled by advantage_max / C (C = advantage_high; sanarl/core/awm_loss.py `awm_advantages`);
  3. batches: one micro-batch per chunk of mini_batch kept samples, holding T = `awm.train_timesteps` levels of the
     rollout grid drawn by `awm.time_type` strata (shared by the chunk) and fresh noise per (level, sample);
  4. objective, on x_s = (1 - s) x0 + s eps for every (level, sample) in one forward:
         log p = the weighted flow-matching error of v_theta(x_s, s) against eps - x0 (`awm_log_prob`),
         L = PPO-clip(log p, old, A) + kl_beta KL(v_theta, v_base) + ema_beta KL(v_theta, v_ema)
     with old the rollout policy's log p (on-policy: the same forward, detached);
  5. after a rollout's last optimizer step: the EMA copy (LoRA adapter "ema") <- d ema + (1 - d) theta.
KL reference: the base (LoRA: adapters disabled; a full fine-tune: a frozen copy taken at set-up).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import TypedDict

import torch

from sanarl.config.schema import Config
from sanarl.core.awm_loss import (
    awm_advantages,
    awm_kl_ema_decay,
    awm_log_prob,
    awm_policy_loss,
    awm_train_step_indices,
    awm_velocity_kl,
)
from sanarl.core.flow import interpolate
from sanarl.core.lora import adapter_parameters, adapters_disabled, using_adapter
from sanarl.methods.awm.config import AWMView, plan, view
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.group_rl.task_base import GroupRLTask
from sanarl.models.base import Cond
from sanarl.training.ema import decay_old_weights
from sanarl.training.protocol import per_rank_batch, run_settings, steps_plan


class _AWMRows(TypedDict):
    x0: torch.Tensor
    """[B, ...] the rollout's final latents."""
    cond: Cond
    steps: torch.Tensor
    """[T] the trained grid step indices (one stratified draw per micro-batch)."""
    s: torch.Tensor
    """[T] their levels on the rollout's grid."""
    eps: torch.Tensor
    """[T, B, ...] fresh noise per (level, sample): x_s = (1 - s) x0 + s eps."""
    adv: torch.Tensor
    """[B] advantages after AWM's clip and scale."""
    chunk: int
    """Index of the sample chunk (an update takes whole chunks, group_rl.task_base.split_updates)."""


class AWMBatch(_AWMRows, total=False):
    """One AWM micro-batch: `mini_batch` kept samples at the T levels of the chunk."""

    old_log_prob: torch.Tensor
    """[T, B] the rollout policy's log p, stored when a rollout serves several optimizer steps."""
    weight: float
    """Loss weight (group_rl.task_base.set_loss_weights; 0 for DDP padding)."""


class AWMTask(GroupRLTask):
    """The `grpo` / `awm` task."""

    lora_names = ("default",)
    sampling_adapter = "default"
    view: AWMView
    method_view = staticmethod(view)
    method_plan = staticmethod(plan)

    def setup_model(self) -> None:
        super().setup_model()
        self.reference: torch.nn.Module | None = None
        if not self.uses_lora and self.view.train_policy.kl_beta > 0:
            self.reference = copy.deepcopy(self.adapter.trainable_module()).requires_grad_(False).eval()

    # --- 1-3: rollout, advantages, batches -------------------------------------------------------------------
    def _padding_batch(self) -> AWMBatch:
        """Zero latents at the first level, so even NaN rollouts pad safely."""
        group = self.last_groups[0]
        zeros = torch.zeros_like(group.latents[:1])
        return AWMBatch(x0=zeros, cond=group.cond.select([0]), steps=torch.zeros(1, dtype=torch.long),
                        s=torch.full((1,), 0.5), eps=zeros.unsqueeze(0), adv=torch.zeros(1), chunk=-1,
                        weight=0.0)  # fmt: skip

    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out the prompts of rollout `step` with the policy, score them, and build its micro-batches."""
        groups, adv, keep = self._scored_rollout(step)
        batches = self._training_batches(groups, adv, keep, rng)
        if self.view.train_policy.optimizer_steps_per_rollout > 1:
            for (
                batch
            ) in batches:  # later updates are off-policy: their ratio needs the rollout policy's log p
                batch["old_log_prob"] = self._old_log_prob(batch)
        return batches

    def _training_batches(
        self, groups: list[PromptGroup], adv: torch.Tensor, keep: torch.Tensor, rng: torch.Generator
    ) -> list[AWMBatch]:
        """3. One micro-batch per chunk of mini_batch samples with its T stratified levels and noise."""
        x0 = torch.cat([g.latents for g in groups])[keep]
        cond = Cond.cat([g.cond.select([0] * len(g.seeds)) for g in groups]).select(keep.nonzero().squeeze(1))
        tp, a = self.view.train_policy, self.view.awm
        adv = awm_advantages(adv[keep], tp.advantage_high, a.advantage_max)
        num_steps = self.rollouts.spec.num_steps
        levels = self.rollouts.spec.sigmas(self.adapter)[:-1]  # the rollout's own grid
        fraction, trained = self.view.diffusers.timesteps_fraction, self.plan.levels
        batches, mb = [], self.run.mini_batch
        for start in range(0, len(x0), mb):
            rows = slice(start, start + mb)
            steps = awm_train_step_indices(trained, num_steps, fraction, scheme=a.time_type, generator=rng)
            eps = torch.randn((trained, *x0[rows].shape), generator=rng)
            batches.append(
                AWMBatch(x0=x0[rows], cond=cond.select(rows), steps=steps, s=levels[steps].float(), eps=eps,
                         adv=adv[rows], chunk=start // mb)
            )  # fmt: skip
        return batches

    # --- 4. objective -------------------------------------------------------------------------------------------
    def _rows(self, batch: AWMBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Cond]:
        """The batch's (level, sample) rows in level-major order: x0, eps, s [T B] and their conditions."""
        device = self.adapter.device
        eps = batch["eps"].to(device)
        levels, size = eps.shape[0], eps.shape[1]
        x0 = batch["x0"].to(device).repeat(levels, *([1] * (eps.ndim - 2)))
        s = batch["s"].to(device).repeat_interleave(size)
        cond = Cond.cat([batch["cond"]] * levels).to(device)
        return x0, eps.flatten(0, 1), s, cond

    def _log_prob(
        self, v: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, s: torch.Tensor
    ) -> torch.Tensor:
        a = self.view.awm
        return awm_log_prob(v, x0, eps, s, weighting=a.weighting, ghuber_power=a.ghuber_power)

    @torch.no_grad()
    def _old_log_prob(self, batch: AWMBatch) -> torch.Tensor:
        """[T, B] log p of the current (rollout) policy on the batch's rows, under the training forward's autocast
        (so the first update's ratio is 1 up to the kernels)."""
        x0, eps, s, cond = self._rows(batch)
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.run.param_dtype)
        scope = nullcontext() if dtype is None else torch.autocast(self.adapter.device.type, dtype=dtype)
        with scope:
            v = self.adapter.velocity(interpolate(x0, eps, s), s, cond)
        return self._log_prob(v, x0, eps, s).reshape(batch["eps"].shape[:2]).cpu()

    def objective(self, batch: AWMBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        x0, eps, s, cond = self._rows(batch)
        x_s = interpolate(x0, eps, s)
        v = self.adapter.velocity(x_s, s, cond)
        log_prob = self._log_prob(v, x0, eps, s).reshape(batch["eps"].shape[:2])
        old = batch.get("old_log_prob")
        old = log_prob.detach() if old is None else old.to(log_prob.device)
        tp, a = self.view.train_policy, self.view.awm
        adv = batch["adv"].to(log_prob.device)
        loss, info = awm_policy_loss(log_prob, old, adv, clip_range=tp.clip_range, loss_type=a.loss_type)
        metrics = {"policy_loss": loss.item(), **{k: float(t) for k, t in info.items()}}
        if tp.kl_beta > 0:
            kl = awm_velocity_kl(v, self._reference_velocity(x_s, s, cond), s, weight=a.kl_weight)
            loss = loss + tp.kl_beta * kl
            metrics["kl_loss"] = kl.item()
        if a.ema_beta > 0:
            with torch.no_grad(), using_adapter(self.adapter.trainable_module(), "ema"):
                v_ema = self.adapter.velocity(x_s, s, cond)
            ema_kl = awm_velocity_kl(v, v_ema, s, weight=a.kl_ema_weight)
            loss = loss + a.ema_beta * ema_kl
            metrics["ema_kl_loss"] = ema_kl.item()
        loss = loss * batch.get("weight", 1.0)
        metrics["log_prob_mean"] = float(log_prob.detach().mean())
        return loss, {"loss": loss.item(), **metrics}

    @torch.no_grad()
    def _reference_velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """The base model's velocity: LoRA disabled, or the frozen copy of a full fine-tune."""
        if self.reference is not None:
            return self.adapter.velocity(x, s, cond, module=self.reference)
        with adapters_disabled(self.adapter.trainable_module()):
            return self.adapter.velocity(x, s, cond)

    # --- 5. after the step ---------------------------------------------------------------------------------------
    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """After the last optimizer step of a rollout (`step` = optimizer steps done): ema <- d ema + (1 - d) theta,
        d = `awm_kl_ema_decay(step, kl_ema_decay, kl_ema_decay_type)` (the reference's global step)."""
        a = self.view.awm
        if a.ema_beta == 0 or step % self.view.train_policy.optimizer_steps_per_rollout:
            return {}
        decay = awm_kl_ema_decay(step, a.kl_ema_decay, a.kl_ema_decay_type)
        module = self.adapter.trainable_module()
        ema, new = adapter_parameters(module, "ema"), adapter_parameters(module, "default")
        pairs = [(ema[k], new[k.replace(".ema.", ".default.")]) for k in ema]
        decay_old_weights([e for e, _ in pairs], [n.detach() for _, n in pairs], decay)
        return {"ema_decay": decay}

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The run's arithmetic: prompts x group per rank, micro-batches, trained levels, the loss."""
        v, run = view(cfg), run_settings(cfg)
        ro, sample, tp, a = v.rollout, v.diffusers.sample, v.train_policy, v.awm
        k, bpr, mb = ro.n_generation, run.batch_per_replica, run.mini_batch
        per_rank = per_rank_batch(run, world)
        trained, spr = plan(cfg), tp.optimizer_steps_per_rollout
        per_epoch = max(1, dataset_size // (bpr // k)) * spr
        ref = "base model (LoRA disabled)" if v.lora is not None else "frozen copy of the initial transformer"
        loss = f"PPO-clip {a.loss_type} (clip_range {tp.clip_range}) on the {a.weighting} flow-matching log p"
        loss += f" + {tp.kl_beta} x KL ({a.kl_weight}) to the {ref}"
        if a.ema_beta > 0:
            loss += f" + {a.ema_beta} x KL ({a.kl_ema_weight}) to the EMA policy ({a.kl_ema_decay_type} decay {a.kl_ema_decay})"
        return [
            ("prompts", f"{dataset_size} in the prompt set"),
            ("batch per step", f"{bpr} / {k} (n_generation) / {world} rank(s) = {per_rank // k} prompts x {k} images"
             f" = {per_rank} samples per rank"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank, x {trained.levels} trained "
             f"levels ({trained.rule}) in one forward = {per_rank // mb} backward passes"),
            ("rollout", f"family {ro.family}: {k} per prompt with the policy, {sample.num_steps} steps, guidance "
             f"{sample.guidance_scale}, solver {sample.solver}"),
            ("advantages", f"clipped to +-{tp.advantage_high}, scaled by {a.advantage_max} / {tp.advantage_high}"
             if a.advantage_max is not None else f"clipped to +-{tp.advantage_high}"),
            ("loss", loss),
            ("steps", steps_plan(run, per_epoch)
             + (f" ({spr} per rollout, each on 1/{spr} of its micro-batches)" if spr > 1 else "")),
        ]  # fmt: skip
