"""Flow-GRPO and Flow-GRPO-Fast: online RL on the reverse SDE (docs/algorithms.md, "Flow-GRPO"; arXiv 2505.05470).

One rollout (served over `optimizer_steps_per_rollout` optimizer steps):
  1. rollout: K samples per prompt with the *current* policy and the stochastic sampler (`sample.solver` flow_sde
     or cps at eta = `sample.noise_level`), storing for the stochastic steps the states x_i, the log-probs
     log p(x_{i+1} | x_i) and the grid; scored;
  2. advantages: per-prompt normalised over every rank's samples, clipped to [advantage_low, advantage_high];
     groups whose rewards are all equal are dropped (`dropped_groups`);
  3. batches: one micro-batch per (chunk of kept samples, trained step);
  4. objective:
         logp = log p_theta(x_{i+1} | x_i)   re-evaluated with x_next = x_{i+1}, same (s_i, s_{i+1}), same guidance
         L    = PPO-clip(logp, logp_rollout, A, clip_range) + kl_beta * mean_B mean_CHW (mu_theta - mu_ref)^2 / (2 std^2)
     with `ratio = "guard"` (GRPO-Guard, flow_sde only) the clip acts on the normalised ratio
         log r = sigma (logp - logp_rollout) + mean_CHW (mu_theta - mu_rollout)^2 / (2 sigma),  sigma = std sqrt(s - s')
     whose old means mu_rollout the rollout stores beside its log-probs (docs/algorithms.md, "GRPO-Guard");
  5. after each step: the ratio extremes and the on-policy self-check are reported.

Old policy: the log-probs stored at rollout are the "old" ones. The rollout's micro-batches are split over
`optimizer_steps_per_rollout` optimizer steps (the SD3.5 presets take 2, as flow_grpo): the first step is on-policy
(every importance ratio is 1 up to numerical noise: the first micro-batch's max |ratio - 1| is logged as
`ratio_first_dev` and warned about above `ratio_warn_tolerance`), the later ones are off-policy, where the PPO clip
acts.
Policy and reference: with `[policy.lora]` the "default" adapter trains and samples, the reference is the base
(adapters disabled); a full fine-tune keeps a frozen copy of the transformer taken at setup as the reference
(only when kl_beta > 0: it doubles the transformer's memory). With CFG in training the guided velocity
v_u + w (v_c - v_u) comes from one batched forward and carries gradient through both branches.
Trained steps: without a window, as flow_grpo, every sample trains the grid steps 0 .. int(N * timesteps_fraction)
- 1 (at least one; CPS's last step lands on s' = 0, is deterministic and never trained). Fast (`sde_window_size`
w > 0): each rollout draws one window [a, a + w), a uniform in [r0, r1 - w] for `sde_window_range` = [r0, r1] (the
window lies inside steps r0..r1-1, as in the reference code); the rollout is Euler outside it and only the window's
steps are stored and trained, all of them.
With `same_noise_per_group` every sample of a group starts from the group's first seed's noise; the SDE noise
still comes from each sample's own seed.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from typing import NamedTuple, NotRequired, TypedDict

import torch

from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.schema import Config
from sanarl.core.advantages import clip_advantages
from sanarl.core.grpo_guard import guard_clip_loss, guard_log_ratio
from sanarl.core.grpo_loss import drop_zero_std_groups, gaussian_mean_kl, ppo_clip_loss
from sanarl.core.lora import adapters_disabled
from sanarl.core.samplers import cfg_velocity, cps_step, flow_sde_step, sample_loop
from sanarl.methods.flow_grpo.config import FlowGRPOView, plan, view
from sanarl.methods.flow_grpo.trajectory import (
    Trajectory,
    sample_trajectories,
    sde_window,
    trainable_positions,
    trained_positions,
)
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.group_rl.task_base import GroupRLTask, reward_metrics
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.training.protocol import per_rank_batch, run_settings, steps_plan
from sanarl.training.sampling import SamplingLoop

log = logging.getLogger(__name__)

STEP_FUNCTIONS = {"flow_sde": flow_sde_step, "cps": cps_step}
"""The stochastic step of each solver; both take `x_next=` to re-evaluate a stored transition."""


class GRPOBatch(TypedDict):
    """One Flow-GRPO micro-batch: `mini_batch` kept samples at one stored SDE step each."""

    x: torch.Tensor
    """[B, ...] the state x_i at the start of the step."""
    x_next: torch.Tensor
    """[B, ...] the rollout's x_{i+1}, whose log-probability is re-evaluated."""
    s: torch.Tensor
    """[B] the step's sigma s_i."""
    s_next: torch.Tensor
    """[B] s_{i+1}."""
    old_log_prob: torch.Tensor
    """[B] log p(x_{i+1} | x_i) at rollout (the "old" policy)."""
    adv: torch.Tensor
    """[B] clipped advantages."""
    chunk: int
    """Index of the sample chunk (an update takes whole chunks)."""
    cond: Cond
    weight: float
    """Loss weight (group_rl.set_loss_weights; 0 for DDP padding)."""
    old_mean: NotRequired[torch.Tensor]
    """[B, ...] float32 the rollout policy's step mean (GRPO-Guard only)."""


class Transition(NamedTuple):
    """One trained step re-evaluated by `FlowGRPOTask._transition` (tensors on the device)."""

    x: torch.Tensor
    s: torch.Tensor
    cond: Cond
    log_prob: torch.Tensor
    """[B] log p_theta(x_{i+1} | x_i), with gradient."""
    old_log_prob: torch.Tensor
    adv: torch.Tensor
    mean: torch.Tensor
    """[B, ...] the policy's step mean, with gradient."""
    std: torch.Tensor
    mean_ref: torch.Tensor | None
    """[B, ...] the reference's step mean (no gradient), None without a KL term."""
    v_extra: torch.Tensor | None
    """[B, ...] the policy's velocity at the extra rows asked for (DDRL's data term), else None."""


# --- the task -------------------------------------------------------------------------------------------------------
class FlowGRPOTask(GroupRLTask):
    """The `grpo` / `flow_grpo` task (LoRA or full fine-tune). The prompt stream, advantages across ranks, updates
    per rollout, padding and reward metrics are group_rl's; the SDE rollout, the objective and the post-step
    self-check are its own."""

    lora_names = ("default",)
    view: FlowGRPOView
    method_view = staticmethod(view)
    method_plan = staticmethod(plan)

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        tp, w = self.view.train_policy, self.view.diffusers.sample.guidance_scale
        if self.adapter.training_guidance(w, tp.cfg_in_training) != w:
            log.warning(
                "flow_grpo: rollouts use CFG (guidance_scale = %s) but train.train_policy.cfg_in_training = false, "
                "so training re-evaluates log-probs without CFG and the importance ratios will not be 1.",
                w,
            )
        self.spec = self.sigmas = self.reference = None
        self.last_trajectories: list[Trajectory] = []
        self._ratio = _RatioMonitor(tp.ratio_warn_tolerance)

    def setup_model(self) -> None:
        super().setup_model()
        sample = self.view.diffusers.sample
        self.spec = replace(self.rollouts.spec, solver=sample.solver, eta=sample.noise_level)
        self.sigmas = self.spec.sigmas(self.adapter)
        if not self.uses_lora and self.view.train_policy.kl_beta > 0:
            self.reference = copy.deepcopy(self.adapter.trainable_module()).requires_grad_(False).eval()

    # --- rollout ------------------------------------------------------------------------------------------------
    def _rollout_autocast(self):
        """The same autocast the runner's training forward runs under, so rollout and re-evaluation match."""
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.run.param_dtype)
        return nullcontext() if dtype is None else torch.autocast(self.adapter.device.type, dtype=dtype)

    def rollout(self, step: int, rng: torch.Generator) -> tuple[list[PromptGroup], list[Trajectory], dict]:
        """This rank's prompt groups of `step`, their trajectories and rollout metrics (window drawn from rng)."""
        tp, k = self.view.train_policy, self.view.rollout.n_generation
        prompts, metas = self._step_prompts(step)
        seeds = self._group_seeds(step, len(prompts), k)
        window = self._rollout_window(step, rng)
        sample_fn = partial(
            sample_trajectories,
            self.adapter,
            spec=self.spec,
            uncond=self.rollouts.uncond,
            window=window,
            same_noise=tp.same_noise_per_group,
            batch_size=self.view.rollout.batch_size,
            keep_means=tp.ratio == "guard",
            loop=self._sampling_loop(window),
        )
        module = self.adapter.trainable_module()
        module.eval()
        with self._rollout_autocast():
            groups, trajectories, metrics = self.rollouts.rollout_with(prompts, metas, seeds, sample_fn)
        module.train()
        if window is not None:
            metrics["sde_window_start"] = float(window[0])
        return groups, trajectories, metrics

    def _rollout_window(self, step: int, rng: torch.Generator) -> tuple[int, int] | None:
        """The stochastic (stored, trained) steps [a, b) of rollout `step`: Fast's window drawn from rng, or None
        (every step stochastic)."""
        tp = self.view.train_policy
        return sde_window(tp.sde_window_size, tp.sde_window_range, self.spec.num_steps, rng)

    def _sampling_loop(self, window: tuple[int, int] | None) -> SamplingLoop:
        """The loop that integrates a rollout (`sanarl.core.samplers.sample_loop`'s signature)."""
        return sample_loop

    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out prompt step `step`, compute advantages, and build all its training micro-batches."""
        # 1. rollout with the current policy on the SDE, storing the stochastic steps and their log-probs
        groups, trajectories, metrics = self.rollout(step, rng)
        # 2. advantages over every rank's samples; groups with all-equal rewards carry no signal
        adv, keep, stats = self._advantages(groups)
        signal, dropped = _signal_mask(groups, keep)
        metrics.update(stats)
        metrics.update(reward_metrics(groups))
        metrics.update(dropped_groups=float(dropped), samples_trained=float(signal.sum()))
        self.last_metrics, self.last_groups, self.last_trajectories = metrics, groups, trajectories
        self._maybe_save_grid(step, groups)
        self._ratio.reset()
        adv = self._transform_advantages(adv)
        # 3. one micro-batch per (chunk of kept samples, trained step)
        return self._training_batches(groups, trajectories, adv, signal, rng)

    def _transform_advantages(self, adv: torch.Tensor) -> torch.Tensor:
        """Advantages as trained: clipped to [advantage_low, advantage_high]."""
        tp = self.view.train_policy
        return clip_advantages(adv, tp.advantage_low, tp.advantage_high)

    def _trained_positions(self, steps: list[int], rng: torch.Generator) -> list[int]:
        """Positions j (into the stored `steps`) every sample of the rollout trains, ascending."""
        cps_last_step = self.view.train_policy.cps_train_last_step
        candidates = trainable_positions(steps, self.sigmas, self.spec.solver, cps_last_step=cps_last_step)
        return trained_positions(candidates, self.plan.levels)

    def _batch_extras(self, rows: torch.Tensor, step: int, first: bool, rng: torch.Generator) -> dict:
        """Fields a subclass adds to the micro-batch of `rows` (indices of this rank's samples) at grid step `step`
        (`first`: the rollout's first trained step)."""
        return {}

    def _training_batches(
        self,
        groups: list[PromptGroup],
        trajectories: list[Trajectory],
        adv: torch.Tensor,
        mask: torch.Tensor,
        rng: torch.Generator,
    ) -> list[GRPOBatch]:
        """One micro-batch per (chunk of mini_batch kept samples, trained step); every sample trains the same steps
        (`trained_positions`)."""
        steps = trajectories[0].steps
        positions = self._trained_positions(steps, rng)
        rows = mask.nonzero().squeeze(1)
        if len(rows) == 0:
            return []
        states = torch.cat([t.states for t in trajectories])[rows]
        old = torch.cat([t.log_probs for t in trajectories])[rows]
        old_means = _old_means(trajectories, rows)
        cond = Cond.cat([g.cond.select([0] * len(g.seeds)) for g in groups]).select(rows)
        n, mb = len(rows), self.run.mini_batch
        batches = []
        for start in range(0, n, mb):
            idx = torch.arange(start, min(start + mb, n))
            for j in positions:
                i = steps[j]
                batches.append(
                    GRPOBatch(
                        x=states[idx, j],
                        x_next=states[idx, j + 1],
                        s=self.sigmas[i].expand(len(idx)).clone(),
                        s_next=self.sigmas[i + 1].expand(len(idx)).clone(),
                        old_log_prob=old[idx, j],
                        adv=adv[rows[idx]],
                        chunk=start // mb,
                        cond=cond.select(idx),
                        weight=1.0,
                        **self._batch_extras(rows[idx], i, j == positions[0], rng),
                    )
                )
                if old_means is not None:
                    batches[-1]["old_mean"] = old_means[idx, j]
        return batches

    def _padding_batch(self) -> GRPOBatch:
        """A zero-weight micro-batch built from this rank's first stored step."""
        t, groups, j = self.last_trajectories[0], self.last_groups, 0
        batch = GRPOBatch(
            x=t.states[:1, j],
            x_next=t.states[:1, j + 1],
            s=self.sigmas[t.steps[j] : t.steps[j] + 1],
            s_next=self.sigmas[t.steps[j] + 1 : t.steps[j] + 2],
            old_log_prob=t.log_probs[:1, j],
            adv=torch.zeros(1),
            chunk=-1,
            cond=groups[0].cond,
            weight=0.0,
        )
        if t.means is not None:
            batch["old_mean"] = t.means[:1, j]
        return batch

    # --- 4. objective: PPO-clip on the re-evaluated log-prob, plus the KL to the reference -------------------
    def objective(self, batch: GRPOBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        t = self._transition(batch)
        tp = self.view.train_policy
        if tp.ratio == "guard":
            policy_loss, m = self._guard_policy_loss(t, batch)
        else:
            policy_loss, m = ppo_clip_loss(t.log_prob, t.old_log_prob, t.adv, tp.clip_range)
        kl = torch.zeros((), device=t.x.device)
        if tp.kl_beta > 0:
            kl = gaussian_mean_kl(t.mean, t.mean_ref, t.std).mean()
        loss = (policy_loss + tp.kl_beta * kl) * batch["weight"]
        metrics = {"loss": loss.item(), "policy_loss": policy_loss.item(), "kl": kl.item()}
        guard = {k: m[k].item() for k in ("log_ratio_guard", "log_ratio_plain") if k in m}
        return loss, metrics | guard | self._ratio_metrics(m, batch["weight"])

    def _guard_policy_loss(
        self, t: Transition, batch: GRPOBatch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """GRPO-Guard's clipped loss on the normalised ratio of the step, sigma = std sqrt(s - s') its transition
        std; the metrics of `ppo_clip_loss` on that ratio, and the batch means of both log-ratios (guard, plain)."""
        device, eps = t.x.device, self.view.train_policy.clip_range
        if "old_mean" not in batch:
            raise RuntimeError(
                "train.train_policy.ratio = 'guard' needs the rollout policy's step means, but this rollout did not "
                "store them (flow_grpo's sample_trajectories keeps them with keep_means=True)."
            )
        sigma = t.std * (batch["s"] - batch["s_next"]).to(device).sqrt()
        log_ratio = guard_log_ratio(t.log_prob, t.old_log_prob, t.mean, batch["old_mean"].to(device), sigma)
        loss, m = guard_clip_loss(log_ratio, t.adv, -eps, eps)
        lr = log_ratio.detach()
        r = torch.exp(lr)
        return loss, {
            "ratio_mean": m["ratio_mean"],
            "ratio_min": r.min(),
            "ratio_max": r.max(),
            "clip_frac": m["clip_frac_low"] + m["clip_frac_high"],
            "approx_kl": 0.5 * lr.square().mean(),
            "log_ratio_guard": lr.mean(),
            "log_ratio_plain": (t.log_prob - t.old_log_prob).detach().mean(),
        }

    def _transition(
        self, batch: GRPOBatch, extra: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> Transition:
        """The trained step re-evaluated: the policy's log-prob of the stored x_{i+1}, its step mean and std, and
        the reference's mean (kl_beta > 0 only), with the batch's tensors on the device; with `extra` rows
        (x_e, s_e) also the policy's velocity there, from the same forward (`_policy_velocity_with`)."""
        device = self.adapter.device
        x, x_next = batch["x"].to(device), batch["x_next"].to(device)
        s, s_next = batch["s"].to(device), batch["s_next"].to(device)
        cond: Cond = batch["cond"].to(device)
        step = partial(
            STEP_FUNCTIONS[self.spec.solver],
            eta=self.spec.eta,
            s_first_next=float(self.sigmas[1]),
            x_next=x_next,
        )
        v, v_extra = self._policy_velocity_with(x, s, cond, extra)
        _, log_prob, mean, std = step(x, v, s, s_next)
        mean_ref = None
        if self.view.train_policy.kl_beta > 0:
            with torch.no_grad():
                _, _, mean_ref, _ = step(x, self._reference_velocity(x, s, cond), s, s_next)
        old, adv = batch["old_log_prob"].to(device), batch["adv"].to(device)
        return Transition(x, s, cond, log_prob, old, adv, mean, std, mean_ref, v_extra)

    def _ratio_metrics(self, m: dict[str, torch.Tensor], weight: float) -> dict[str, float]:
        """Feed the on-policy self-check (real batches only) and return the PPO metrics of a micro-batch."""
        if weight > 0:
            self._ratio.update(m["ratio_min"].item(), m["ratio_max"].item())
        return {k: m[k].item() for k in ("ratio_mean", "clip_frac", "approx_kl")}

    def _policy_velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v_theta as at rollout: with CFG (and cfg_in_training) v_u + w (v_c - v_u) from one batched forward,
        differentiable through both branches (the guided sampler is the policy, docs/algorithms.md "Flow-GRPO")."""
        return self._policy_velocity_with(x, s, cond, None)[0]

    def _policy_velocity_with(
        self, x: torch.Tensor, s: torch.Tensor, cond: Cond, extra: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_policy_velocity`, and with `extra = (x_e, s_e)` ([B, ...], [B]) also the conditional, unguided
        velocity at those rows under the same conditioning, from the same single forward (one forward per backward,
        as DDP needs; DDRL's data term)."""
        w = self._training_guidance()
        uncond = self.rollouts.uncond
        if extra is None:
            return self.adapter.guided_velocity(x, s, cond, uncond, w), None
        batch, (x_e, s_e) = x.shape[0], extra
        s = torch.as_tensor(s, device=x.device, dtype=torch.float32).expand(batch)
        guided = uncond is not None and w != 1.0
        xs = [x, x, x_e] if guided else [x, x_e]
        ss = [s, s, s_e.to(s)] if guided else [s, s_e.to(s)]
        conds = [uncond.expand_to(batch), cond, cond] if guided else [cond, cond]
        v = self.adapter.velocity(torch.cat(xs), torch.cat(ss), Cond.cat([c.expand_to(batch) for c in conds]))
        parts = v.split(batch)
        if not guided:
            return parts[0], parts[1]
        return cfg_velocity(parts[0], parts[1], w), parts[2]

    @torch.no_grad()
    def _reference_velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """The reference model's velocity, guided like the policy's: base weights (LoRA off) or the frozen copy."""
        with self._reference_weights() as module:
            return self.adapter.guided_velocity(
                x, s, cond, self.rollouts.uncond, self._training_guidance(), module
            )

    def _training_guidance(self) -> float:
        """The guidance of the policy's and the reference's forwards (the family decides, `training_guidance`)."""
        return self.adapter.training_guidance(
            self.spec.guidance_scale, self.view.train_policy.cfg_in_training
        )

    @contextmanager
    def _reference_weights(self) -> Iterator[torch.nn.Module | None]:
        """The KL reference for the forwards inside the block: the frozen copy (yielded), or the base model, the
        trained module with its adapters disabled (None is yielded: run the trained module)."""
        if self.reference is not None:
            yield self.reference
            return
        with adapters_disabled(self.adapter.trainable_module()):
            yield None

    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """Flow-GRPO has no old adapter to move: report the step's ratio extremes and the self-check."""
        return self._ratio.metrics()

    @classmethod
    def describe(cls, cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The run's arithmetic: prompts x group per rank, rollout sampler, trained steps, backward passes."""
        v, run = cls.method_view(cfg), run_settings(cfg)
        tp, sample = v.train_policy, v.diffusers.sample
        k, bpr, mb, n = v.rollout.n_generation, run.batch_per_replica, run.mini_batch, sample.num_steps
        per_rank = per_rank_batch(run, world)
        trained = cls.method_plan(cfg)
        per_epoch = max(1, dataset_size // (bpr // k)) * tp.optimizer_steps_per_rollout
        sde = (
            f"SDE window of {tp.sde_window_size} steps inside steps [{tp.sde_window_range[0]}, "
            f"{tp.sde_window_range[1]}), Euler elsewhere"
            if tp.sde_window_size > 0
            else "SDE at every step"
        )
        ref = "base model (LoRA disabled)" if v.lora is not None else "frozen copy of the initial transformer"
        return [
            ("prompts", f"{dataset_size} in the prompt set"),
            ("batch per step", f"{bpr} / {k} (n_generation) / {world} rank(s) = {per_rank // k} prompts x {k} images"
             f" = {per_rank} samples per rank"),
            ("rollout", f"{sample.solver} eta {sample.noise_level}, {n} steps, {sde}, guidance "
             f"{sample.guidance_scale}, current policy" + (", one initial noise per group" if tp.same_noise_per_group else "")),
            ("trained steps", f"{trained.levels} per sample ({trained.rule})" + ("" if tp.sde_window_size > 0 else
             f", grid steps 0 .. {trained.levels - 1}") + "; groups with equal rewards dropped"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank, x {trained.levels} trained "
             f"steps = {(per_rank // mb) * trained.levels} backward passes (at most)"),
            ("loss", ("GRPO-Guard's normalised ratio, " if tp.ratio == "guard" else "")
             + f"PPO-clip (clip_range {tp.clip_range}) + {tp.kl_beta} x KL to the {ref}"),
            ("updates", f"{tp.optimizer_steps_per_rollout} optimizer step(s) per rollout, each on 1/"
             f"{tp.optimizer_steps_per_rollout} of its micro-batches"),
            ("steps", steps_plan(run, per_epoch)),
        ]  # fmt: skip


class _RatioMonitor:
    """The on-policy self-check: ratio extremes of a step, and a warning (once per step) when the first
    micro-batch's max |ratio - 1| exceeds the tolerance (mismatched timesteps, guidance or dtype between rollout
    and training)."""

    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance
        self.reset()

    def reset(self) -> None:
        self.low, self.high, self.first_dev = float("inf"), float("-inf"), None

    def update(self, low: float, high: float) -> None:
        if self.first_dev is None:
            self.first_dev = max(abs(low - 1.0), abs(high - 1.0))
            if self.first_dev > self.tolerance:
                log.warning(
                    "flow_grpo on-policy self-check: the first micro-batch's importance ratios lie in [%.6g, %.6g] "
                    "(max |ratio - 1| = %.3g > train.train_policy.ratio_warn_tolerance = %.3g) although the policy "
                    "has not stepped since the rollout: rollout and training disagree (timesteps, guidance, "
                    "dtype / autocast, dropout or a non-deterministic model).",
                    low,
                    high,
                    self.first_dev,
                    self.tolerance,
                )
        self.low, self.high = min(self.low, low), max(self.high, high)

    def metrics(self) -> dict[str, float]:
        if self.first_dev is None:
            return {}
        return {"ratio_min": self.low, "ratio_max": self.high, "ratio_first_dev": self.first_dev}


def _old_means(trajectories: list[Trajectory], rows: torch.Tensor) -> torch.Tensor | None:
    """[n, T, ...] the rollout's step means of the kept samples `rows` (GRPO-Guard), None if not stored."""
    if trajectories[0].means is None:
        return None
    return torch.cat([t.means for t in trajectories])[rows]


def _signal_mask(groups: list[PromptGroup], keep: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mask [N] of samples with a finite reward in a group whose finite rewards are not all equal, and the number
    of groups (by prompt string) dropped for having all-equal rewards."""
    prompts = [g.prompt for g in groups for _ in g.seeds]
    rewards = torch.cat([g.reward.total for g in groups])
    signal = torch.zeros_like(keep)
    finite = [p for p, k in zip(prompts, keep.tolist(), strict=True) if k]
    if finite:
        signal[keep] = drop_zero_std_groups(finite, rewards[keep])
    dropped = {p for p, k, s in zip(prompts, keep.tolist(), signal.tolist(), strict=True) if k and not s}
    return signal, len(dropped)
