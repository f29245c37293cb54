"""DDRL: data-regularized Flow-GRPO (docs/algorithms.md, "DDRL"; arXiv 2512.04332, Cosmos-RL's wfm trainer).

One rollout (served over `optimizer_steps_per_rollout` optimizer steps):
  1. prompts and data: with `ddrl.data_source = "dataset"` this step's items are the plugin's SFT items (image +
     caption), the captions are the groups' prompts and x0_g = VAE(image_g) is group g's data; with "synthetic" the
     prompts are the RL prompt set and x0_g is one Euler sample of the base model per group (its own seed);
  2. rollout: Flow-GRPO's (the SDE / CPS steps with the current policy, states, log-probs, initial noises);
  3. advantages: per prompt over every rank, then -exp(-A) with `exp_reward`, then clipped; groups with equal
     rewards dropped;
  4. batches: one micro-batch per (chunk of kept samples, trained step), the steps of `train_on` (explicit, and
     -1 drawn per rollout) or Flow-GRPO's rule; each carries its rows' data x0, noise and level
     (`use_rl_sigma_and_noise`: the step's sigma and the sample's initial noise; else fresh draws);
  5. objective (sanarl/core/ddrl.py `ddrl_loss`):
         L = loss_scale [PPO-clip(logp, logp_rollout, A, clip_range) + kl_beta KL(mu_theta, mu_ref)
             + data_beta mean w(s) (v_theta((1 - s) x0 + s eps, s, c) - (eps - x0))^2]
     with w(s) = s^2 + (1 - s)^2 (`data_weighting = "edm"`, Cosmos-RL's) or 1 ("uniform"); the data velocity comes
     from the policy's forward (one forward per backward); with `data_on_first_only` the data term is taken at the
     first trained step only.
KL reference: the base model, or with `update_ref_every_iter = n` the policy copied before every optimizer step
k with k % n = 0 (LoRA: the adapter "ref", checkpointed with the others; full fine-tune: the frozen copy).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch

from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.schema import Config
from sanarl.core.ddrl import data_weight, ddrl_advantages, ddrl_loss, select_train_on
from sanarl.core.flow import interpolate
from sanarl.core.lora import adapters_disabled, copy_adapter, using_adapter
from sanarl.core.samplers import initial_noise, sample_loop
from sanarl.core.timesteps import sample_u, u_to_sigma
from sanarl.datasets.common import collate as default_collate
from sanarl.errors import ConfigError, DataError
from sanarl.methods.ddrl.config import DDRLView, plan, uses_data_items, view
from sanarl.methods.flow_grpo.task import FlowGRPOTask, GRPOBatch
from sanarl.methods.flow_grpo.trajectory import Trajectory, trainable_positions
from sanarl.methods.group_rl.rollout import PromptGroup, group_seeds
from sanarl.methods.group_rl.task_base import checked_prompt_dataset
from sanarl.methods.sft.task import draw_vae_noise, encode_media, latent_shape_of, media_key
from sanarl.models.base import Cond, DiffusionAdapter

SYNTHETIC_STREAM = 1
"""The `group_seeds` stream of the synthetic data's seeds (the rollout's samples use stream 0)."""


class DDRLBatch(GRPOBatch, total=False):
    """A Flow-GRPO micro-batch plus its rows' data term (present when `data_beta` > 0)."""

    data_x0: torch.Tensor
    """[B, ...] the data latent of each row's prompt group."""
    data_eps: torch.Tensor
    """[B, ...] the noise of the data term."""
    data_s: torch.Tensor
    """[B] its noise level."""
    data_on: bool
    """Whether this micro-batch takes the data term (false off the first step with `data_on_first_only`)."""


def sft_items_config(cfg: Config) -> Config:
    """The run's config as the plugin sees it when asked for its SFT items (`train.train_policy.type = "sft"`)."""
    out = copy.deepcopy(cfg)
    out.train.train_policy.type = "sft"
    return out


class DDRLTask(FlowGRPOTask):
    """The `grpo` / `ddrl` task: Flow-GRPO's rollout, batches and policy term (inherited), plus the data term, the
    `train_on` steps, the exp-reward advantages and the moving KL reference."""

    view: DDRLView
    method_view = staticmethod(view)
    method_plan = staticmethod(plan)

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        self._data_items = uses_data_items(cfg)  # read by _load_dataset, which the base constructor calls
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        self.collate = getattr(plugin, "collate", default_collate)
        self.base: torch.nn.Module | None = None
        self._items: list[dict] | None = None
        self._data_x0: torch.Tensor | None = None
        self._initial: torch.Tensor | None = None

    def _load_dataset(self, cfg: Config, plugin: DatasetPlugin, world: int):
        """The plugin's SFT items (image + caption) when the data term reads the dataset, else its prompt set."""
        if not self._data_items:
            return super()._load_dataset(cfg, plugin, world)
        fix = (
            "use a plugin with images and captions (docs/plugins.md) or set train.train_policy.ddrl.data_source = "
            "'synthetic' (samples of the base model)"
        )
        try:
            items = plugin.get_dataset(sft_items_config(cfg))
        except (ConfigError, DataError) as err:
            raise DataError(
                f"train.train_policy.ddrl.data_source = 'dataset' reads the SFT items (image + caption) of plugin "
                f"`{plugin.__name__}`, which refused: {err} For DDRL, {fix}."
            ) from None
        dataset = checked_prompt_dataset(items, cfg, world)
        if not any(key in dataset[0] for key in ("image", "video")):
            raise DataError(
                f"train.train_policy.ddrl.data_source = 'dataset' trains on the plugin's images, but "
                f"`{plugin.__name__}` gives SFT items without an `image` (or `video`); {fix}."
            )
        return dataset

    @property
    def _data_term(self) -> bool:
        return self.view.ddrl.data_beta > 0

    def setup_model(self) -> None:
        super().setup_model()
        d = self.view.ddrl
        if not self.uses_lora and self._data_term and d.data_source == "synthetic":
            # the synthetic data's frozen base; the KL reference's copy serves when it never moves
            keep = self.reference is not None and d.update_ref_every_iter == 0
            module = self.adapter.trainable_module()
            self.base = self.reference if keep else copy.deepcopy(module).requires_grad_(False).eval()
        if not self.uses_lora and d.update_ref_every_iter > 0 and self.reference is None:
            self.reference = copy.deepcopy(self.adapter.trainable_module()).requires_grad_(False).eval()

    # --- the moving KL reference --------------------------------------------------------------------------------
    def micro_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        every = self.view.ddrl.update_ref_every_iter
        if every > 0 and step % every == 0:
            self._refresh_reference()
        return super().micro_batches(step, rng)

    @torch.no_grad()
    def _refresh_reference(self) -> None:
        """KL reference <- the policy (LoRA: adapter "ref" <- "default"; full fine-tune: the frozen copy)."""
        module = self.adapter.trainable_module()
        if self.uses_lora:
            copy_adapter(module, src="default", dst="ref")
        else:
            self.reference.load_state_dict(module.state_dict())

    @contextmanager
    def _reference_weights(self) -> Iterator[torch.nn.Module | None]:
        if self.uses_lora and self.view.ddrl.update_ref_every_iter > 0:
            with using_adapter(self.adapter.trainable_module(), "ref"):
                yield None
            return
        with super()._reference_weights() as module:
            yield module

    # --- 1-2. prompts, data and the rollout ---------------------------------------------------------------------
    def _step_prompts(self, step: int) -> tuple[list[str], list[dict]]:
        items = self._step_items(step)
        self._items = items if self._data_items else None
        return [it["prompt"] for it in items], [it.get("metadata", {}) for it in items]

    def rollout(self, step: int, rng: torch.Generator) -> tuple[list[PromptGroup], list[Trajectory], dict]:
        groups, trajectories, metrics = super().rollout(step, rng)
        self._initial = torch.cat([t.initial for t in trajectories])
        if self._data_term:
            dataset = self.view.ddrl.data_source == "dataset"
            self._data_x0 = self._dataset_latents(rng) if dataset else self._synthetic_latents(step, groups)
        return groups, trajectories, metrics

    @torch.no_grad()
    def _dataset_latents(self, rng: torch.Generator) -> torch.Tensor:
        """x0_g = VAE(image_g) of this step's items [G, ...] (on CPU), drawn as SFT draws them."""
        batch = self.collate(self._items)
        media = batch[media_key(batch, self.plugin.__name__)]
        latent = latent_shape_of(self.adapter, media.shape)
        want = self.adapter.latent_shape(self.spec.height, self.spec.width)
        if tuple(latent) != tuple(want):
            raise DataError(
                f"the plugin's media {tuple(media.shape[1:])} give latents {tuple(latent)}, but the rollout samples "
                f"{tuple(want)} (policy.diffusers.inference_size = [{self.spec.height}, {self.spec.width}], video: "
                "inference_frames); DDRL's data term mixes the data with the rollout's noise, so both need one "
                "shape: match inference_size (and train_frames to inference_frames) to the data."
            )
        noise = draw_vae_noise(self.adapter, len(media), latent, rng)
        with self._rollout_autocast():
            x0 = encode_media(self.adapter, media.to(self.adapter.device), noise)
        return x0.float().cpu()

    @torch.no_grad()
    def _synthetic_latents(self, step: int, groups: list[PromptGroup]) -> torch.Tensor:
        """One sample of the frozen base model per prompt group [G, ...] (on CPU): Euler on the rollout's grid and
        guidance, from the group's seed of stream `SYNTHETIC_STREAM` (keyed by its global position, as rollouts)."""
        first = self.rank * len(groups)
        seeds = [
            group_seeds(self.run.seed, step, SYNTHETIC_STREAM, first + p, 1)[0] for p in range(len(groups))
        ]
        shape = self.adapter.latent_shape(self.spec.height, self.spec.width)
        x, _ = initial_noise(shape, seeds, device=self.adapter.device)
        cond = Cond.cat([g.cond for g in groups]).to(self.adapter.device)
        module = self.adapter.trainable_module()
        scope = adapters_disabled(module) if self.uses_lora else _nothing()
        velocity = partial(
            self.adapter.guided_velocity, cond=cond, uncond=self.rollouts.uncond, guidance_scale=self.spec.guidance_scale,
            module=self.base,
        )  # fmt: skip
        module.eval()
        with scope, self._rollout_autocast():
            out = sample_loop(lambda x_, s_: velocity(x_, s_), x, self.sigmas.to(x.device), solver="euler")
        module.train()
        return out.latents.float().cpu()

    # --- 3-4. advantages and batches ----------------------------------------------------------------------------
    def _transform_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        tp = self.view.train_policy
        return ddrl_advantages(adv, self.view.ddrl.exp_reward, tp.advantage_low, tp.advantage_high)

    def _trained_positions(self, steps: list[int], rng: torch.Generator) -> list[int]:
        """`train_on` (explicit steps, -1 drawn from the others per rollout), else Flow-GRPO's rule."""
        train_on = self.view.ddrl.train_on
        if not train_on:
            return super()._trained_positions(steps, rng)
        trainable = trainable_positions(
            steps, self.sigmas, self.spec.solver, cps_last_step=self.view.train_policy.cps_train_last_step
        )
        candidates = [steps[j] for j in trainable]
        chosen = select_train_on(train_on, candidates, rng)
        return [steps.index(i) for i in chosen]

    def _batch_extras(self, rows: torch.Tensor, step: int, first: bool, rng: torch.Generator) -> dict:
        """The data term's x0 (the rows' groups'), noise and level for the rows at grid step `step`."""
        d = self.view.ddrl
        if not self._data_term:
            return {}
        x0 = self._data_x0[rows // self.view.rollout.n_generation]
        if d.use_rl_sigma_and_noise:
            s = self.sigmas[step].expand(len(rows)).clone()
            eps = self._initial[rows]
        else:
            diff = self.view.diffusers
            u = sample_u(
                diff.weighting_scheme, len(rows), generator=rng, logit_mean=diff.logit_mean,
                logit_std=diff.logit_std, mode_scale=diff.mode_scale,
            )  # fmt: skip
            s = u_to_sigma(u, self.spec.shift)
            eps = torch.randn(x0.shape, generator=rng)
        on = not d.data_on_first_only or first
        return {"data_x0": x0, "data_eps": eps, "data_s": s.float(), "data_on": on}

    def _padding_batch(self) -> DDRLBatch:
        batch: DDRLBatch = super()._padding_batch()
        if self._data_term:  # the same forwards as a real batch (DDP), at zero weight
            s = batch["s"].clone()
            batch.update(data_x0=self._data_x0[:1], data_eps=self._initial[:1], data_s=s, data_on=True)
        return batch

    # --- 5. objective ---------------------------------------------------------------------------------------------
    def objective(self, batch: DDRLBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        tp, d, device = self.view.train_policy, self.view.ddrl, self.adapter.device
        extra = x0 = eps = weight = None
        if self._data_term and batch["data_on"]:
            x0, eps, s = (batch[k].to(device) for k in ("data_x0", "data_eps", "data_s"))
            extra, weight = (interpolate(x0, eps, s), s), data_weight(s, d.data_weighting)
        t = self._transition(batch, extra)
        loss, m = ddrl_loss(
            t.log_prob, t.old_log_prob, t.adv, tp.clip_range, kl_beta=tp.kl_beta, mean=t.mean, mean_ref=t.mean_ref,
            std=t.std, data_beta=d.data_beta, v_data=t.v_extra, x0=x0, eps=eps, data_weight=weight,
            loss_scale=d.loss_scale,
        )  # fmt: skip
        loss = loss * batch["weight"]
        metrics = {"loss": loss.item(), **{k: m[k].item() for k in ("policy_loss", "kl", "data_loss")}}
        return loss, metrics | self._ratio_metrics(m, batch["weight"])

    @classmethod
    def describe(cls, cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """Flow-GRPO's plan with DDRL's trained steps, data term and loss."""
        rows = super().describe(cfg, dataset_size, world)
        d, tp = cfg.train.train_policy.ddrl, cfg.train.train_policy
        source = (
            "the plugin's images and captions (the captions are the prompts)"
            if d.data_source == "dataset"
            else "one base-model sample per prompt group"
        )
        where = (
            "the trained step's sigma and the sample's initial noise"
            if d.use_rl_sigma_and_noise
            else ("a fresh sigma and noise")
        )
        weighting = "(s^2 + (1 - s)^2) x " if d.data_weighting == "edm" else ""
        data = (
            f"{d.data_beta} x {weighting}flow matching on {source}, at {where}"
            + (", first trained step only" if d.data_on_first_only else ", every trained step")
            if d.data_beta > 0
            else "none (data_beta = 0: Flow-GRPO's objective)"
        )
        ref = (
            f", reference = the policy every {d.update_ref_every_iter} steps"
            if d.update_ref_every_iter
            else ""
        )
        out = []
        for label, value in rows:
            if label == "trained steps" and d.train_on:
                trained = plan(cfg)
                value = f"{trained.levels} per sample: {trained.rule}"
            if label == "loss":
                terms = f"PPO-clip (clip_range {tp.clip_range}) + {tp.kl_beta} x KL{ref} + {data}"
                value = (f"{d.loss_scale} x ({terms})" if d.loss_scale != 1 else terms) + (
                    "; advantages -exp(-A)" if d.exp_reward else ""
                )
            out.append((label, value))
        return out


@contextmanager
def _nothing() -> Iterator[None]:
    yield
