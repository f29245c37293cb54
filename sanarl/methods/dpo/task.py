"""Diffusion-DPO on rectified flow (arXiv 2311.12908; docs/algorithms.md, "Diffusion-DPO"), offline and online.

Both train the same pair loss (`pair_loss`): a pair is a prompt c with a chosen latent x0_w and a rejected latent
x0_l; both are noised at one level s with one noise eps, x_s = (1 - s) x0 + s eps, and

    err(v, x0) = mean_CHW (v - (eps - x0))^2                 for the policy (theta) and the frozen reference
    inside     = -beta_dpo / 2 ((err_theta(w) - err_ref(w)) - (err_theta(l) - err_ref(l)))
    loss       = -mean_pairs log sigmoid(inside)               (sanarl/core/dpo_loss.py)

The policy's two latents go through one forward (2P rows), the reference's through one forward without gradient.
Reference: with `[policy.lora]` the base model (adapters disabled); a full fine-tune keeps a frozen copy of the
transformer taken at setup (before a resume restores the trained weights, so it stays the base).

Offline (`DPOTask`, type "sft"): one step reads this rank's pair items (the plugin's `{"prompt", "chosen",
"rejected"}`, sanarl.datasets.pairs), draws per pair u from the timestep density of `[policy.diffusers]`, eps and the
caption-dropout mask for the whole per-rank batch at once (micro-batch split invariant, as SFT), s = shift(u), and
encodes both images with the VAE (the SFT data path).
Online (`DPOOnlineTask`, type "grpo"): K samples per prompt from the current policy (the plain sampler of
`policy.diffusers.sample`), scored, advantages over every rank's samples (group_rl); each group of at least two
scored samples gives one pair, its highest advantage as chosen and its lowest as rejected (`best_worst_pairs`), then
one level and one noise per pair as offline; a micro-batch holds the pairs of `mini_batch` samples (mini_batch / K).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypedDict

import torch

from sanarl.config.dataset_plugins import DatasetPlugin, plugin_label
from sanarl.config.schema import Config, DiffusersConfig
from sanarl.core.dpo_loss import best_worst_pairs, dpo_loss, velocity_errors
from sanarl.core.flow import interpolate
from sanarl.core.lora import adapters_disabled
from sanarl.core.timesteps import sample_u, u_to_sigma
from sanarl.datasets.pairs import check_pair_item
from sanarl.methods.checked_task import ItemTask
from sanarl.methods.dpo.config import DPOOnlineView, DPOView, online_view, plan, view
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.group_rl.task_base import GroupRLTask, reward_metrics
from sanarl.methods.sft.task import draw_flow_matching_noise, draw_vae_noise, encode_media, latent_shape_of
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.training.data_order import split_batch, step_indices
from sanarl.training.protocol import per_rank_batch, run_settings, steps_plan
from sanarl.training.sampling import generate_latents, grid_shift


# --- the loss both variants train -----------------------------------------------------------------------------------
def pair_errors(
    adapter: DiffusionAdapter,
    x0_w: torch.Tensor,
    x0_l: torch.Tensor,
    eps: torch.Tensor,
    s: torch.Tensor,
    cond: Cond,
    module: torch.nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(err_w, err_l) [P] of one model (`module`; default the trained one, as it is now): one forward over the chosen
    and the rejected latents noised at the same s with the same eps."""
    x0 = torch.cat([x0_w, x0_l])
    both_eps, both_s = torch.cat([eps, eps]), torch.cat([s, s])
    v = adapter.velocity(interpolate(x0, both_eps, both_s), both_s, Cond.cat([cond, cond]), module)
    return velocity_errors(v, x0, both_eps).chunk(2)


class PairReference:
    """The frozen reference of a DPO task: the base (LoRA off) or a copy of the transformer taken at setup."""

    adapter: DiffusionAdapter
    uses_lora: bool
    reference: torch.nn.Module | None = None

    def take_reference(self) -> None:
        """After the trainable module is set up: copy it when there is no LoRA (a full fine-tune's reference)."""
        if not self.uses_lora:
            self.reference = copy.deepcopy(self.adapter.trainable_module()).requires_grad_(False).eval()

    @contextmanager
    def reference_weights(self) -> Iterator[torch.nn.Module | None]:
        """Inside the block: the module to run as the reference (the frozen copy), or None with the adapters of
        the trained module disabled (its base weights)."""
        if self.reference is not None:
            yield self.reference
            return
        with adapters_disabled(self.adapter.trainable_module()):
            yield None

    def pair_loss(self, batch: dict, cond: Cond, beta: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The DPO loss of a micro-batch whose `x0_w`, `x0_l`, `eps`, `s` are on the device (module docstring)."""
        x0_w, x0_l, eps, s = batch["x0_w"], batch["x0_l"], batch["eps"], batch["s"]
        err_w, err_l = pair_errors(self.adapter, x0_w, x0_l, eps, s, cond)
        with torch.no_grad(), self.reference_weights() as module:
            ref_w, ref_l = pair_errors(self.adapter, x0_w, x0_l, eps, s, cond, module)
        loss, metrics = dpo_loss(err_w, err_l, ref_w, ref_l, beta)
        return loss, {k: float(v) for k, v in metrics.items()} | {"sigma_mean": float(s.mean())}


# --- offline --------------------------------------------------------------------------------------------------------
class DPOBatch(TypedDict, total=False):
    """One offline micro-batch: the plugin's collated pair items plus the step's randomness."""

    prompt: list[str]
    chosen: torch.Tensor
    """[B, 3, H, W] in [0, 1]: the preferred images."""
    rejected: torch.Tensor
    """[B, 3, H, W] in [0, 1]."""
    u: torch.Tensor
    """[B] timestep draws; s = shift(u) with the grid shift of the images' size."""
    s: torch.Tensor
    """[B] the pair's level."""
    eps: torch.Tensor
    """[B, *latent] the pair's noise (chosen and rejected share it)."""
    keep_caption: torch.Tensor
    """[B] bool: False drops the caption (caption dropout)."""
    vae_noise: torch.Tensor
    """[B, *latent] posterior noise of a sampling VAE encoder for the chosen images (only then)."""
    vae_noise_rejected: torch.Tensor
    """The same for the rejected images."""


class DPOTask(PairReference, ItemTask):
    """Offline Diffusion-DPO on the plugin's pair items (`type = "sft"`, `trainer_type = "dpo"`)."""

    view: DPOView
    method_view = staticmethod(view)

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        check_pair_item(self.train_dataset[0], plugin_label(plugin))

    def setup_model(self) -> None:
        super().setup_model()
        self.take_reference()

    def steps_per_epoch(self) -> int:
        return max(1, len(self.train_dataset) // self.run.batch_per_replica)

    def micro_batches(self, step: int, rng: torch.Generator) -> list[DPOBatch]:
        idx = step_indices(len(self.train_dataset), self.run.seed, step, rank=self.rank, world=self.world,
                           per_rank=self.per_rank_batch())  # fmt: skip
        batch = self.collate([self.train_dataset[i] for i in idx])
        chosen = batch["chosen"]
        latent = latent_shape_of(self.adapter, chosen.shape)
        batch.update(draw_flow_matching_noise(self.view.diffusers, len(idx), latent, rng))
        shift = grid_shift(self.adapter, self.view.diffusers.sample.flow_shift, *chosen.shape[-2:])
        batch["s"] = u_to_sigma(batch["u"], shift)
        batch.update(draw_vae_noise(self.adapter, len(idx), latent, rng))
        rejected_noise = draw_vae_noise(self.adapter, len(idx), latent, rng)
        if rejected_noise:
            batch["vae_noise_rejected"] = rejected_noise["vae_noise"]
        return split_batch(batch, self.run.mini_batch)

    def objective(self, batch: DPOBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """The DPO loss of one micro-batch of pairs: both images through the VAE, then `pair_loss`."""
        adapter = self.adapter
        rejected_batch = {"vae_noise": batch["vae_noise_rejected"]} if "vae_noise_rejected" in batch else {}
        x0_w = encode_media(adapter, batch["chosen"], batch)
        x0_l = encode_media(adapter, batch["rejected"], rejected_batch)
        cond = adapter.encode_captions(batch["prompt"], batch["keep_caption"].tolist())
        device = x0_w.device
        tensors = {"x0_w": x0_w, "x0_l": x0_l, "eps": batch["eps"].to(device), "s": batch["s"].to(device)}
        loss, metrics = self.pair_loss(tensors, cond, self.view.dpo.beta_dpo)
        return loss, {"loss": loss.item(), **metrics}

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The batch arithmetic, without loading a model (used by `sanarl validate`)."""
        run = run_settings(cfg)
        bpr, mb = run.batch_per_replica, run.mini_batch
        per_rank = per_rank_batch(run, world)
        reference = "the base (LoRA off)" if run.lora is not None else "a frozen copy of the transformer"
        return [
            ("preference pairs", str(dataset_size)),
            ("batch per step", f"{bpr} pairs (train_batch_per_replica) / {world} rank(s) = {per_rank} per rank"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank per step, each "
             f"{2 * mb} rows (chosen + rejected) through the policy and the reference"),
            ("levels", f"{plan(cfg).rule}; beta_dpo {cfg.train.train_policy.dpo.beta_dpo:g}; reference {reference}"),
            ("steps", steps_plan(run, max(1, dataset_size // bpr))),
        ]  # fmt: skip


# --- online ---------------------------------------------------------------------------------------------------------
class PairBatch(TypedDict, total=False):
    """One online micro-batch: the pairs of `mini_batch` samples (mini_batch / K groups) of one rollout."""

    x0_w: torch.Tensor
    """[P, ...] the chosen samples' final latents."""
    x0_l: torch.Tensor
    cond: Cond
    """[P] the pairs' prompts."""
    s: torch.Tensor
    eps: torch.Tensor
    adv: torch.Tensor
    """[P] chosen minus rejected advantage (logged; its length counts the rows for the loss weights)."""
    chunk: int
    weight: float
    """Loss weight (group_rl.task_base.set_loss_weights; 0 for DDP padding)."""


def draw_pair_levels(diff: DiffusersConfig, count: int, shift: float, latent: tuple[int, ...],
                     rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(s [P], eps [P, *latent]) of `count` pairs: u from the timestep density, s = shift(u), then the noise."""
    u = sample_u(diff.weighting_scheme, count, generator=rng, logit_mean=diff.logit_mean,
                 logit_std=diff.logit_std, mode_scale=diff.mode_scale)  # fmt: skip
    return u_to_sigma(u, shift), torch.randn((count, *latent), generator=rng)


def group_pairs(groups: list[PromptGroup], adv: torch.Tensor, keep: torch.Tensor) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices over the concatenated groups: per group, its kept samples' best and worst
    advantage (`best_worst_pairs`; a group with fewer than two kept samples gives none)."""
    owner = torch.cat([torch.full((len(g.seeds),), i) for i, g in enumerate(groups)])
    kept = keep.nonzero().flatten()
    pairs = best_worst_pairs(owner[kept].tolist(), adv[kept])
    return [(int(kept[w]), int(kept[r])) for w, r in pairs]


class DPOOnlineTask(PairReference, GroupRLTask):
    """Online Diffusion-DPO (`type = "grpo"`, `trainer_type = "dpo"`): best and worst of each rollout group."""

    lora_names = ("default",)
    view: DPOOnlineView
    method_view = staticmethod(online_view)
    method_plan = staticmethod(plan)

    def setup_model(self) -> None:
        super().setup_model()
        self.take_reference()

    def _sample_group(self, cond: Cond, seeds: list[int]) -> tuple[torch.Tensor, None]:
        """Final latents of one prompt's seeds from the current policy, in chunks of rollout.batch_size."""
        rollouts, out, bs = self.rollouts, [], self.view.rollout.batch_size
        with torch.no_grad():
            for i in range(0, len(seeds), bs):
                chunk = seeds[i : i + bs]
                out.append(
                    generate_latents(self.adapter, cond, chunk, rollouts.spec, uncond=rollouts.uncond).latents
                )
        return torch.cat(out), None

    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out rollout `step` from the current policy, score it, pair each group's best and worst, and cut the
        pairs into micro-batches."""
        prompts, metas = self._step_prompts(step)
        seeds = self._group_seeds(step, len(prompts), self.view.rollout.n_generation)
        module = self.adapter.trainable_module()
        module.eval()
        groups, _, metrics = self.rollouts.rollout_with(prompts, metas, seeds, self._sample_group)
        module.train()
        adv, keep, stats = self._advantages(groups)
        pairs = group_pairs(groups, adv, keep)
        margin = torch.tensor([float(adv[w] - adv[r]) for w, r in pairs])
        metrics |= stats | reward_metrics(groups)
        metrics |= {
            "dpo_num_pairs": float(len(pairs)),
            "dpo_adv_margin_mean": float(margin.mean()) if pairs else 0.0,
        }
        self.last_metrics, self.last_groups = metrics, groups
        self._maybe_save_grid(step, groups)
        if not pairs:  # no group has two scored samples: one self-pair, which has no gradient
            return [self._padding_batch() | {"chunk": 0}]
        return self._pair_batches(groups, pairs, margin, rng)

    def _pair_batches(self, groups: list[PromptGroup], pairs: list[tuple[int, int]], margin: torch.Tensor,
                      rng: torch.Generator) -> list[PairBatch]:  # fmt: skip
        latents = torch.cat([g.latents for g in groups])
        cond = Cond.cat([g.cond.select([0] * len(g.seeds)) for g in groups])
        chosen, rejected = [w for w, _ in pairs], [r for _, r in pairs]
        s, eps = draw_pair_levels(
            self.view.diffusers, len(pairs), self.rollouts.spec.shift, latents.shape[1:], rng
        )
        mb = max(1, self.run.mini_batch // self.view.rollout.n_generation)  # the pairs of mini_batch samples
        batches = []
        for start in range(0, len(pairs), mb):
            rows = slice(start, start + mb)
            batches.append(PairBatch(x0_w=latents[chosen][rows], x0_l=latents[rejected][rows],
                                     cond=cond.select(chosen[rows]), s=s[rows], eps=eps[rows], adv=margin[rows],
                                     chunk=start // mb))  # fmt: skip
        return batches

    def _padding_batch(self) -> PairBatch:
        """A self-pair of zero latents (loss log 2, no gradient), weight 0, for DDP padding."""
        group = self.last_groups[0]
        zeros = torch.zeros_like(group.latents[:1])
        return PairBatch(x0_w=zeros, x0_l=zeros.clone(), cond=group.cond.select([0]), s=torch.full((1,), 0.5),
                         eps=zeros.clone(), adv=torch.zeros(1), chunk=-1, weight=0.0)  # fmt: skip

    def objective(self, batch: PairBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.adapter.device
        tensors = {k: batch[k].to(device) for k in ("x0_w", "x0_l", "eps", "s")}
        loss, metrics = self.pair_loss(tensors, batch["cond"].to(device), self.view.dpo.beta_dpo)
        weighted = loss * batch.get("weight", 1.0)
        return weighted, {"loss": weighted.item(), **metrics}

    @classmethod
    def describe(cls, cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """Prompts x group per rank, the pairs they give, micro-batches, the rollout."""
        v, run = cls.method_view(cfg), run_settings(cfg)
        ro, sample = v.rollout, v.diffusers.sample
        k, bpr, mb = ro.n_generation, run.batch_per_replica, run.mini_batch
        per_rank = per_rank_batch(run, world)
        pairs = per_rank // k
        spr = v.train_policy.optimizer_steps_per_rollout
        reference = "the base (LoRA off)" if run.lora is not None else "a frozen copy of the transformer"
        return [
            ("prompts", f"{dataset_size} in the prompt set"),
            ("batch per step", f"{bpr} / {k} (n_generation) / {world} rank(s) = {pairs} prompts x {k} images"
             f" = {per_rank} samples per rank"),
            ("micro-batches", f"{pairs} pairs per rank (each group's best and worst advantage) / {mb // k} per "
             f"micro-batch (mini_batch {mb} / {k}) = {-(-pairs // (mb // k))} per rank, x {plan(cfg).levels} trained "
             f"levels ({plan(cfg).rule}), {2 * (mb // k)} rows each"),
            ("loss", f"beta_dpo {v.dpo.beta_dpo:g}, reference {reference}"),
            ("rollout", f"{k} per prompt from the current policy, {sample.num_steps} steps, guidance "
             f"{sample.guidance_scale}, solver {sample.solver}"),
            ("steps", steps_plan(run, max(1, dataset_size // (bpr // k)) * spr)),
        ]  # fmt: skip
