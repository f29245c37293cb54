"""MixGRPO: Flow-GRPO with the SDE confined to a window that slides along the grid (docs/algorithms.md, "MixGRPO";
arXiv 2507.21802, Tencent-Hunyuan/MixGRPO).

One rollout r (served over `optimizer_steps_per_rollout` optimizer steps, so r = optimizer step // that count, and
a resumed run finds the window again from its step alone):
  1. window: `mixgrpo_window(r)`, the steps [a, b): the start moves by `stride` every `interval` rollouts, from 0,
     back to 0 past the last start num_steps - 2 (`roll_back`), b = min(a + window_size, num_steps - 2);
  2. rollout (`mixgrpo_sample_loop`): Euler on the steps before a, Flow-GRPO's SDE step (eta = noise_level) on
     a .. b - 1, storing their states and log-probs, then Euler on the grid (MixGRPO) or DPM-Solver++(2M) on a tail
     of int((N + 1 - b) r) levels (`tail_solver = "dpm2"`, `compress_ratio` r: MixGRPO-Flash); scored;
  3. advantages (`advantage_aggr`, MixGRPO's): each reward normalised in its prompt group by its mean and sample std
     + 1e-8, summed with the rewards' weights, clipped to [advantage_low, advantage_high]; groups whose rewards are
     all equal dropped (else Flow-GRPO's normaliser of the combined reward);
  4. batches and objective: Flow-GRPO's (the PPO clip on every window step's re-evaluated log-prob, the step's loss
     the mean over its (sample, step) rows).
A window at a = num_steps - 2 is empty: that rollout is an ODE rollout and trains nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from sanarl.config.schema import Config
from sanarl.core.mixgrpo import aggregate_advantages, mixgrpo_grid, mixgrpo_sample_loop, mixgrpo_window
from sanarl.core.samplers import SampleOutput
from sanarl.methods.flow_grpo.task import FlowGRPOTask
from sanarl.methods.flow_grpo.trajectory import Trajectory
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.mixgrpo.config import MixGRPOView, plan, view
from sanarl.training.sampling import SamplingLoop


def rollout_grid(
    sigmas: torch.Tensor, *, shift: float, window_end: int, compress_ratio: float | None
) -> torch.Tensor:
    """The grid a rollout runs on (`mixgrpo_grid`); its level b, where the compressed tail starts, is the run's own
    `sigmas[b]` (the two agree to one float32 ulp), so the window's last step is re-evaluated on the level it took."""
    grid = mixgrpo_grid(
        sigmas, num_steps=len(sigmas) - 1, shift=shift, window_end=window_end, compress_ratio=compress_ratio
    )
    if compress_ratio is None:
        return grid
    grid = grid.clone()
    grid[window_end] = sigmas[window_end].to(grid)
    return grid


def mixed_loop(
    velocity_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x_init: torch.Tensor,
    sigmas: torch.Tensor,
    *,
    shift: float,
    dpm_tail: bool,
    compress_ratio: float | None,
    solver: str,
    eta: float,
    window: tuple[int, int] | None,
    generators: Sequence[torch.Generator] | None = None,
    return_trajectory: bool = False,
    return_means: bool = False,
) -> SampleOutput:
    """MixGRPO's rollout with `sample_loop`'s signature (`sanarl.training.sampling.SamplingLoop`): the mixed loop
    on `rollout_grid`; an empty window stores no log-prob ([B, 0]). The window's steps are Flow-GRPO's SDE steps
    (validate requires `solver = "flow_sde"`); the loop keeps no step means (GRPO-Guard's ratio is refused with
    MixGRPO at validate), so asking for them is an error, not a silent None."""
    if solver != "flow_sde" or window is None or return_means:
        raise ValueError(
            f"mixed_loop: solver {solver!r} (needs 'flow_sde'), window {window} (needs one), return_means "
            f"{return_means} (not kept by MixGRPO's rollout)"
        )
    grid = rollout_grid(sigmas, shift=shift, window_end=window[1], compress_ratio=compress_ratio)
    out = mixgrpo_sample_loop(
        velocity_fn, x_init, grid, window=window, eta=eta, dpm_tail=dpm_tail, generators=generators,
        return_trajectory=return_trajectory,
    )  # fmt: skip
    if out.log_probs is None:
        out.log_probs = torch.zeros((x_init.shape[0], 0), dtype=torch.float32, device=x_init.device)
    return out


class MixGRPOTask(FlowGRPOTask):
    """The `grpo` / `mixgrpo` task: Flow-GRPO's advantages, batches and objective (inherited) on MixGRPO's rollout,
    whose sliding window is the stored and trained steps."""

    view: MixGRPOView
    method_view = staticmethod(view)
    method_plan = staticmethod(plan)

    def _rollout_window(self, step: int, rng: torch.Generator) -> tuple[int, int]:
        """The window of rollout `step` (a pure function of it: `mixgrpo_window`)."""
        m = self.view.mixgrpo
        return mixgrpo_window(
            step, num_steps=self.spec.num_steps, size=m.window_size, interval=m.interval, stride=m.stride,
            roll_back=m.roll_back,
        )  # fmt: skip

    def _sampling_loop(self, window: tuple[int, int] | None) -> SamplingLoop:
        m = self.view.mixgrpo
        return partial(
            mixed_loop,
            shift=self.spec.shift,
            dpm_tail=m.tail_solver == "dpm2",
            compress_ratio=m.compress_ratio if m.compress_ratio < 1 else None,
        )

    def rollout(self, step: int, rng: torch.Generator) -> tuple[list[PromptGroup], list[Trajectory], dict]:
        """Flow-GRPO's rollout on the window, reporting its start (`sde_window_start`) and length (`window_steps`)."""
        groups, trajectories, metrics = super().rollout(step, rng)
        metrics["window_steps"] = float(len(trajectories[0].steps))
        return groups, trajectories, metrics

    def _advantages(self, groups: list[PromptGroup]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """MixGRPO's `advantage_aggr` over each prompt group's kept samples (a group is whole on its rank); with
        `advantage_aggr = false`, Flow-GRPO's."""
        if not self.view.mixgrpo.advantage_aggr:
            return super()._advantages(groups)
        weights = {f.name: f.weight for f in self.view.train_policy.remote_reward.reward_fns}
        adv, keep, flat = [], [], 0
        for g in groups:
            kept = ~g.reward.nan_mask
            count = int(kept.sum())
            a = torch.zeros(len(kept), dtype=torch.float32)
            if count >= 2:
                rewards = {name: g.reward.per_key[name][kept].float() for name in weights}
                a[kept] = aggregate_advantages(rewards, weights, count)
                flat += int(bool((g.reward.total[kept] == g.reward.total[kept][0]).all()))
            adv.append(a)
            keep.append(kept)
        return torch.cat(adv), torch.cat(keep), {"zero_std_ratio": flat / max(1, len(groups))}

    @classmethod
    def describe(cls, cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """Flow-GRPO's plan with MixGRPO's rollout and trained steps."""
        m, sample = cfg.train.train_policy.mixgrpo, cfg.policy.diffusers.sample
        n = sample.num_steps
        moves = (
            f"its start moves by {m.stride} every {m.interval} rollouts"
            + (f", back to 0 past step {n - 2}" if m.roll_back else f", up to step {n - 2}")
            if m.stride
            else "it stays at step 0"
        )
        tail = (
            "Euler after it"
            if m.tail_solver == "euler"
            else "DPM-Solver++(2M) after it"
            + (f" on int((N + 1 - b) x {m.compress_ratio}) levels" if m.compress_ratio < 1 else "")
        )
        out = []
        for label, value in super().describe(cfg, dataset_size, world):
            if label == "rollout":
                value = (
                    f"Euler, then flow_sde eta {sample.noise_level} in a window of {m.window_size} of the {n} steps "
                    f"({moves}), {tail}; guidance {sample.guidance_scale}, current policy"
                    + (", one initial noise per group" if cfg.train.train_policy.same_noise_per_group else "")
                )
            if label == "loss" and m.advantage_aggr:
                value += "; advantages: each reward per group (sample std + 1e-8), summed with its weight"
            if label == "trained steps":
                value = (
                    f"{m.window_size} per sample (every window step; fewer where it meets step {n - 2}); groups "
                    "with equal rewards dropped"
                )
            out.append((label, value))
        return out
