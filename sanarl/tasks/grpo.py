"""Flow-GRPO and Flow-GRPO-Fast: online RL on the reverse SDE (docs/algorithms.md, "Flow-GRPO"; arXiv 2505.05470).

Per rollout: roll out K samples per prompt with the *current* policy and the stochastic sampler (`sample.solver`
flow_sde or cps at eta = `sample.noise_level`), storing for the stochastic steps the states x_i, the log-probs
log p(x_{i+1} | x_i) and the grid; score, turn rewards into per-prompt advantages (clipped to
[advantage_low, advantage_high]), drop the groups whose rewards are all equal (counted as `dropped_groups`), then
train each kept sample on its trained steps:

    logp  = log p_theta(x_{i+1} | x_i)   re-evaluated with x_next = x_{i+1}, same (s_i, s_{i+1}), same guidance
    L     = PPO-clip(logp, logp_rollout, A, clip_range) + kl_beta * mean_B mean_CHW (mu_theta - mu_ref)^2 / (2 std^2)

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
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial

import torch

from sanarl.config.schema import Config
from sanarl.core.advantages import PerPromptStatTracker, clip_advantages
from sanarl.core.flow import sigma_grid
from sanarl.core.grpo_loss import drop_zero_std_groups, gaussian_mean_kl, ppo_clip_loss
from sanarl.core.lora import adapters_disabled
from sanarl.core.samplers import cps_step, flow_sde_step, initial_noise, sample_loop
from sanarl.errors import ConfigError
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.tasks.base import Task, per_rank_batch
from sanarl.tasks.nft import (
    NFTTask,
    _reward_metrics,
    check_steps_per_rollout,
    load_prompt_dataset,
    set_loss_weights,
)
from sanarl.tasks.rollout import PromptGroup
from sanarl.tasks.sampling import GenerationSpec

log = logging.getLogger(__name__)

STEP_FUNCTIONS = {"flow_sde": flow_sde_step, "cps": cps_step}
"""The stochastic step of each solver; both take `x_next=` to re-evaluate a stored transition."""


@dataclass
class Trajectory:
    """The stored SDE steps of one prompt group (on CPU).

    states: [K, T + 1, ...] x at the start of each stored step, then after the last one (x_a .. x_b).
    log_probs: [K, T] float32 log p(x_{i+1} | x_i) at rollout (the "old" log-probs).
    steps: the T grid indices i (consecutive) of the steps s_i -> s_{i+1}.
    """

    states: torch.Tensor
    log_probs: torch.Tensor
    steps: list[int]


# --- pure helpers ---------------------------------------------------------------------------------------------------
def sde_window(
    size: int, window_range: list[int], num_steps: int, rng: torch.Generator
) -> tuple[int, int] | None:
    """Flow-GRPO-Fast window [a, a + size), a uniform in [r0, r1 - size]; None (every step stochastic) if size 0."""
    if size <= 0:
        return None
    r0, r1 = window_range
    if not (0 <= r0 and r0 + size <= r1 <= num_steps):
        raise ValueError(f"window size {size} does not fit in range {window_range} of {num_steps} steps")
    start = r0 + int(torch.randint(r1 - size - r0 + 1, (1,), generator=rng))
    return start, start + size


def trainable_positions(steps: list[int], sigmas: torch.Tensor, solver: str) -> list[int]:
    """Positions j of the stored steps whose transition is random: all for flow_sde; for cps all but a step that
    lands on s' = 0 (its std s' sin(eta pi / 2) is 0, the step is deterministic and has no log-prob)."""
    if solver == "flow_sde":
        return list(range(len(steps)))
    return [j for j, i in enumerate(steps) if float(sigmas[i + 1]) > 0]


def trained_count(candidates: int, fraction: float, windowed: bool) -> int:
    """Steps trained per sample: every window step (Fast), else max(1, int(candidates * timesteps_fraction))."""
    return candidates if windowed else max(1, int(candidates * fraction))


def trained_positions(candidates: list[int], num_steps: int, fraction: float, *, windowed: bool) -> list[int]:
    """The stored-step positions every sample trains, in rollout order. Fast: every window step. Without a window,
    as flow_grpo: the first int(num_steps * timesteps_fraction) steps of the grid (at least one), i.e. steps
    0 .. int(N frac) - 1, never past the random ones (CPS's deterministic last step is not a candidate)."""
    if windowed:
        return list(candidates)
    return list(candidates[: min(len(candidates), trained_count(num_steps, fraction, False))])


def check_grpo_config(cfg: Config) -> None:
    """Flow-GRPO's own settings (the loader checks solver and noise_level); ConfigError naming key and fix."""
    tp, sample, ro = cfg.train.train_policy, cfg.policy.diffusers.sample, cfg.rollout
    n = sample.num_steps
    if sample.solver not in STEP_FUNCTIONS or sample.noise_level <= 0:
        raise ConfigError(
            f"flow_grpo needs stochastic rollouts with log-probabilities, but policy.diffusers.sample.solver = "
            f"{sample.solver!r} and noise_level = {sample.noise_level}; set solver = 'flow_sde' (or 'cps') and "
            "noise_level > 0 (e.g. 0.7)."
        )
    if tp.clip_range <= 0 or tp.ratio_warn_tolerance < 0:
        raise ConfigError(
            f"train.train_policy.clip_range = {tp.clip_range} must be > 0 and ratio_warn_tolerance = "
            f"{tp.ratio_warn_tolerance} >= 0; Flow-GRPO uses clip_range = 1e-4 and ratio_warn_tolerance = 1e-3."
        )
    if ro.family != "diffusionnft" or ro.num_candidates not in (0, ro.n_generation):
        raise ConfigError(
            f"flow_grpo rolls out exactly rollout.n_generation samples per prompt with the trained policy; "
            f"rollout.family = {ro.family!r} / num_candidates = {ro.num_candidates} (Sol-RL's searches, for "
            "DiffusionNFT) do not apply: remove them (family = 'diffusionnft', num_candidates = 0)."
        )
    _check_window(tp.sde_window_size, tp.sde_window_range, n, sample.solver)
    check_steps_per_rollout(cfg)
    if sample.solver == "cps" and tp.sde_window_size == 0 and n < 2:
        raise ConfigError(
            "with solver = 'cps' the last step lands on s' = 0 deterministically, so num_steps = 1 leaves no step "
            "to train; set policy.diffusers.sample.num_steps >= 2."
        )


def _check_window(size: int, window_range: list[int], num_steps: int, solver: str) -> None:
    if size < 0:
        raise ConfigError(
            f"train.train_policy.sde_window_size = {size} must be >= 0 (0 = every step stochastic)."
        )
    if size == 0:
        return
    last = num_steps - 1 if solver == "cps" else num_steps
    ok = len(window_range) == 2 and 0 <= window_range[0] and window_range[0] + size <= window_range[1] <= last
    if not ok:
        why = (
            " (with cps the last step is deterministic and cannot be in the window)"
            if solver == "cps"
            else ""
        )
        raise ConfigError(
            f"train.train_policy.sde_window_range = {window_range} with sde_window_size = {size}: the window "
            f"[a, a + {size}) must lie inside the range [r0, r1) and r1 <= {last}{why}, with "
            f"policy.diffusers.sample.num_steps = {num_steps}; set sde_window_range = [0, {last}] (or a sub-range) "
            f"and sde_window_size <= {last}."
        )


# --- rollout ----------------------------------------------------------------------------------------------------------
@torch.no_grad()
def sample_trajectories(
    adapter: DiffusionAdapter,
    cond: Cond,
    seeds: list[int],
    spec: GenerationSpec,
    *,
    uncond: Cond | None,
    window: tuple[int, int] | None,
    same_noise: bool,
    batch_size: int,
) -> tuple[torch.Tensor, Trajectory]:
    """SDE rollout of one prompt group with the active policy: final latents [K, ...] and the stored steps.

    Same path as `sampling.generate_latents` (explicit per-sample seeds, `sample_loop`, the adapter's CFG), but
    keeps the trajectory of the stochastic steps on CPU and can share one initial noise per group.
    """
    shape = adapter.latent_shape(spec.height, spec.width)
    sigmas = sigma_grid(spec.num_steps, spec.shift, device=adapter.device)
    a, b = window if window is not None else (0, spec.num_steps)
    shared = initial_noise(shape, seeds[:1], device=adapter.device)[0] if same_noise else None
    finals, states, log_probs = [], [], []
    for start in range(0, len(seeds), batch_size):
        x, generators = initial_noise(shape, seeds[start : start + batch_size], device=adapter.device)
        if shared is not None:
            x = shared.expand_as(x).clone()
        out = sample_loop(
            partial(_guided, adapter, cond, uncond, spec.guidance_scale),
            x,
            sigmas,
            solver=spec.solver,
            eta=spec.eta,
            generators=generators,
            return_trajectory=True,
            window=window,
        )
        finals.append(out.latents)
        states.append(torch.stack(out.trajectory[a : b + 1], dim=1).cpu())
        log_probs.append(out.log_probs.cpu())
    return torch.cat(finals), Trajectory(torch.cat(states), torch.cat(log_probs), list(range(a, b)))


def _guided(
    adapter: DiffusionAdapter, cond: Cond, uncond: Cond | None, w: float, x: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    """The rollout's velocity function (x [B, ...], s [B]) -> v [B, ...]: CFG when w != 1."""
    return adapter.guided_velocity(x, s, cond, uncond, w)


# --- the task -------------------------------------------------------------------------------------------------------
class FlowGRPOTask(NFTTask):
    """The `grpo` / `flow_grpo` task. Shares NFT's prompt stream, advantages across ranks, rollout grids, reward
    metrics and engine; the rollout, the objective and the post-step hook are its own."""

    lora_names = ("default",)

    def __init__(self, cfg: Config, adapter, plugin, *, rank: int = 0, world: int = 1) -> None:
        # Task's constructor, not NFT's (which requires LoRA): Flow-GRPO may fine-tune the whole transformer
        Task.__init__(self, cfg, adapter, plugin, rank=rank, world=world)
        check_grpo_config(cfg)
        self.train_dataset = load_prompt_dataset(cfg, plugin, world)
        tp, w = cfg.train.train_policy, cfg.policy.diffusers.sample.guidance_scale
        if w != 1.0 and not tp.cfg_in_training:
            log.warning(
                "flow_grpo: rollouts use CFG (guidance_scale = %s) but train.train_policy.cfg_in_training = false, "
                "so training re-evaluates log-probs without CFG and the importance ratios will not be 1.",
                w,
            )
        self.tracker = PerPromptStatTracker(global_std=tp.global_std)
        self.engine = self.spec = self.sigmas = self.reference = None
        self.last_metrics: dict[str, float] = {}
        self.last_groups: list[PromptGroup] = []
        self.last_trajectories: list[Trajectory] = []
        self.run_dir = None
        self._ratio = _RatioMonitor(tp.ratio_warn_tolerance)
        self._pending: tuple[int, list[dict]] | None = None

    def setup_model(self) -> None:
        super().setup_model()
        sample = self.cfg.policy.diffusers.sample
        self.spec = replace(self.engine.spec, solver=sample.solver, eta=sample.noise_level)
        self.sigmas = sigma_grid(self.spec.num_steps, self.spec.shift)
        if not self.uses_lora and self.cfg.train.train_policy.kl_beta > 0:
            self.reference = copy.deepcopy(self.adapter.trainable_module()).requires_grad_(False).eval()

    # --- rollout ------------------------------------------------------------------------------------------------
    def _rollout_autocast(self):
        """The same autocast the runner's training forward runs under, so rollout and re-evaluation match."""
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.cfg.train.param_dtype)
        return nullcontext() if dtype is None else torch.autocast(self.adapter.device.type, dtype=dtype)

    def rollout(self, step: int, rng: torch.Generator) -> tuple[list[PromptGroup], list[Trajectory], dict]:
        """This rank's prompt groups of `step`, their trajectories and rollout metrics (window drawn from rng)."""
        tp, k = self.cfg.train.train_policy, self.cfg.rollout.n_generation
        prompts, metas = self._step_prompts(step)
        seeds = self._group_seeds(step, len(prompts), k)
        window = sde_window(tp.sde_window_size, tp.sde_window_range, self.spec.num_steps, rng)
        sample_fn = partial(
            sample_trajectories,
            self.adapter,
            spec=self.spec,
            uncond=self.engine.uncond,
            window=window,
            same_noise=tp.same_noise_per_group,
            batch_size=self.cfg.rollout.batch_size,
        )
        module = self.adapter.trainable_module()
        module.eval()
        with self._rollout_autocast():
            groups, trajectories, metrics = self.engine.rollout_with(prompts, metas, seeds, sample_fn)
        module.train()
        if window is not None:
            metrics["sde_window_start"] = float(window[0])
        return groups, trajectories, metrics

    def _finish_chunk(self, batches: list[dict]) -> list[dict]:
        """Pad to the ranks' common micro-batch count and weight rows so the step's loss is the row mean."""
        padded = self._pad_for_ddp(batches, self.last_groups, self.last_trajectories)
        set_loss_weights(batches, len(padded))
        return padded

    def _rollout_batches(self, step: int, rng: torch.Generator) -> list[dict]:
        """Roll out prompt step `step`, compute advantages, and build all its (shuffled) training micro-batches."""
        groups, trajectories, metrics = self.rollout(step, rng)
        adv, keep, stats = self._advantages(groups)
        signal, dropped = _signal_mask(groups, keep)
        metrics.update(stats)
        metrics.update(_reward_metrics(groups))
        metrics.update(dropped_groups=float(dropped), samples_trained=float(signal.sum()))
        self.last_metrics, self.last_groups, self.last_trajectories = metrics, groups, trajectories
        self._maybe_save_grid(step, groups)
        self._ratio.reset()
        tp = self.cfg.train.train_policy
        adv = clip_advantages(adv, tp.advantage_low, tp.advantage_high)
        return self._training_batches(groups, trajectories, adv, signal, rng)

    def _training_batches(
        self,
        groups: list[PromptGroup],
        trajectories: list[Trajectory],
        adv: torch.Tensor,
        mask: torch.Tensor,
        rng: torch.Generator,
    ) -> list[dict]:
        """One micro-batch per (chunk of mini_batch kept samples, trained step); every sample trains the same steps
        (`trained_positions`)."""
        steps = trajectories[0].steps
        positions = trained_positions(
            trainable_positions(steps, self.sigmas, self.spec.solver),
            self.spec.num_steps,
            self.cfg.policy.diffusers.timesteps_fraction,
            windowed=self.cfg.train.train_policy.sde_window_size > 0,
        )
        rows = mask.nonzero().squeeze(1)
        if len(rows) == 0:
            return []
        states = torch.cat([t.states for t in trajectories])[rows]
        old = torch.cat([t.log_probs for t in trajectories])[rows]
        cond = Cond.cat([g.cond.select([0] * len(g.seeds)) for g in groups]).select(rows)
        n, mb = len(rows), self.cfg.train.train_policy.mini_batch
        batches = []
        for start in range(0, n, mb):
            idx = torch.arange(start, min(start + mb, n))
            for j in positions:
                i = steps[j]
                batches.append(
                    {
                        "x": states[idx, j],
                        "x_next": states[idx, j + 1],
                        "s": self.sigmas[i].expand(len(idx)).clone(),
                        "s_next": self.sigmas[i + 1].expand(len(idx)).clone(),
                        "old_log_prob": old[idx, j],
                        "adv": adv[rows[idx]],
                        "chunk": start // mb,
                        "cond": cond.select(idx),
                        "weight": 1.0,
                    }
                )
        return batches

    def _pad_for_ddp(
        self, batches: list[dict], groups: list[PromptGroup], trajectories: list[Trajectory]
    ) -> list[dict]:
        """With several ranks every rank must run as many backward passes (DDP all-reduces in each): pad with
        zero-weight micro-batches built from this rank's first sample."""
        if self.world == 1:
            return batches
        from accelerate.utils import gather

        count = torch.tensor([len(batches)], device=self.adapter.device)
        most = int(gather(count).max())
        t, j = trajectories[0], 0
        pad = {
            "x": t.states[:1, j],
            "x_next": t.states[:1, j + 1],
            "s": self.sigmas[t.steps[j] : t.steps[j] + 1],
            "s_next": self.sigmas[t.steps[j] + 1 : t.steps[j] + 2],
            "old_log_prob": t.log_probs[:1, j],
            "adv": torch.zeros(1),
            "cond": groups[0].cond,
            "weight": 0.0,
        }
        return batches + [pad] * (most - len(batches))

    # --- objective ----------------------------------------------------------------------------------------------
    def objective(self, batch: dict, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.adapter.device
        x, x_next = batch["x"].to(device), batch["x_next"].to(device)
        s, s_next = batch["s"].to(device), batch["s_next"].to(device)
        cond: Cond = batch["cond"].to(device)
        tp = self.cfg.train.train_policy
        step = partial(
            STEP_FUNCTIONS[self.spec.solver],
            eta=self.spec.eta,
            s_first_next=float(self.sigmas[1]),
            x_next=x_next,
        )
        _, log_prob, mean, std = step(x, self._policy_velocity(x, s, cond), s, s_next)
        policy_loss, m = ppo_clip_loss(
            log_prob, batch["old_log_prob"].to(device), batch["adv"].to(device), tp.clip_range
        )
        kl = torch.zeros((), device=device)
        if tp.kl_beta > 0:
            with torch.no_grad():
                _, _, mean_ref, _ = step(x, self._reference_velocity(x, s, cond), s, s_next)
            kl = gaussian_mean_kl(mean, mean_ref, std).mean()
        loss = (policy_loss + tp.kl_beta * kl) * batch["weight"]
        if batch["weight"] > 0:
            self._ratio.update(m["ratio_min"].item(), m["ratio_max"].item())
        metrics = {"loss": loss.item(), "policy_loss": policy_loss.item(), "kl": kl.item()}
        metrics.update({k: m[k].item() for k in ("ratio_mean", "clip_frac", "approx_kl")})
        return loss, metrics

    def _policy_velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v_theta as at rollout: with CFG (and cfg_in_training) v_u + w (v_c - v_u) from one batched forward,
        differentiable through both branches (the guided sampler is the policy, docs/algorithms.md "Flow-GRPO")."""
        w = self.spec.guidance_scale if self.cfg.train.train_policy.cfg_in_training else 1.0
        return self.adapter.guided_velocity(x, s, cond, self.engine.uncond, w)

    @torch.no_grad()
    def _reference_velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """The reference model's velocity, guided like the policy's: base weights (LoRA off) or the frozen copy."""
        # a guidance-distilled model (no CFG batch) embeds the rollout's guidance in every forward
        embedded = not self.adapter.cfg_batch
        w = self.spec.guidance_scale if self.cfg.train.train_policy.cfg_in_training or embedded else 1.0
        if self.reference is not None:
            return self.adapter.guided_velocity(x, s, cond, self.engine.uncond, w, self.reference)
        with adapters_disabled(self.adapter.trainable_module()):
            return self.adapter.guided_velocity(x, s, cond, self.engine.uncond, w)

    def after_optimizer_step(self, step: int) -> dict[str, float]:
        """Flow-GRPO has no old adapter to move: report the step's ratio extremes and the self-check."""
        return self._ratio.metrics()

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The run's arithmetic: prompts x group per rank, rollout sampler, trained steps, backward passes (after
        Flow-GRPO's own config checks, so `sanarl validate` reports them too)."""
        check_grpo_config(cfg)
        tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
        k, bpr, mb, n = (
            cfg.rollout.n_generation,
            cfg.train.train_batch_per_replica,
            tp.mini_batch,
            sample.num_steps,
        )
        per_rank = per_rank_batch(cfg, world)
        trained, trained_why = _trained_plan(cfg)
        per_epoch = max(1, dataset_size // (bpr // k)) * tp.optimizer_steps_per_rollout
        total = cfg.train.epoch * per_epoch
        if cfg.train.max_num_steps is not None:
            total = min(total, cfg.train.max_num_steps)
        sde = (
            f"SDE window of {tp.sde_window_size} steps inside steps [{tp.sde_window_range[0]}, "
            f"{tp.sde_window_range[1]}), Euler elsewhere"
            if tp.sde_window_size > 0
            else "SDE at every step"
        )
        ref = (
            "base model (LoRA disabled)"
            if cfg.policy.lora is not None
            else "frozen copy of the initial transformer"
        )
        return [
            ("prompts", f"{dataset_size} in the prompt set"),
            ("batch per step", f"{bpr} / {k} (n_generation) / {world} rank(s) = {per_rank // k} prompts x {k} images"
             f" = {per_rank} samples per rank"),
            ("rollout", f"{sample.solver} eta {sample.noise_level}, {n} steps, {sde}, guidance "
             f"{sample.guidance_scale}, current policy" + (", one initial noise per group" if tp.same_noise_per_group else "")),
            ("trained steps", f"{trained} per sample ({trained_why})" + ("" if tp.sde_window_size > 0 else
             f", grid steps 0 .. {trained - 1}") + "; groups with equal rewards dropped"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank, x {trained} trained steps = "
             f"{(per_rank // mb) * trained} backward passes (at most)"),
            ("loss", f"PPO-clip (clip_range {tp.clip_range}) + {tp.kl_beta} x KL to the {ref}"),
            ("updates", f"{tp.optimizer_steps_per_rollout} optimizer step(s) per rollout, each on 1/"
             f"{tp.optimizer_steps_per_rollout} of its micro-batches"),
            ("steps", f"{per_epoch} per epoch x {cfg.train.epoch} epoch(s) -> {total} optimizer steps"),
        ]  # fmt: skip


def _trained_plan(cfg: Config) -> tuple[int, str]:
    """Steps trained per sample and why, from the config alone (for `describe`)."""
    tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
    if (
        tp.sde_window_size > 0
    ):  # every window step is random (cps windows exclude the deterministic last step)
        return tp.sde_window_size, "every window step"
    candidates = sample.num_steps - int(sample.solver == "cps")  # cps's last step to s' = 0 is deterministic
    fraction, n = cfg.policy.diffusers.timesteps_fraction, sample.num_steps
    count = min(candidates, trained_count(n, fraction, False))
    return (
        count,
        f"max(1, int({n} x {fraction}))",
    )


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
