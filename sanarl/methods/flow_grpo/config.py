"""Flow-GRPO's config view and checks (docs/algorithms.md, "Flow-GRPO"; docs/grpo.md for the keys)."""

from __future__ import annotations

from sanarl.config.group_rl_schema import FlowGRPOPolicy
from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods.group_rl.config import (
    GroupRLView,
    check_group_rl,
    check_rollout_family,
    check_steps_per_rollout,
    group_view,
    rollouts_for,
)
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork, fraction_levels

STOCHASTIC_SOLVERS = ("flow_sde", "cps")
"""The samplers whose steps have a log-probability (sanarl/core/samplers.py `flow_sde_step`, `cps_step`)."""


FlowGRPOView = GroupRLView[FlowGRPOPolicy]
"""The group-RL sections with Flow-GRPO's policy keys."""


def view(cfg: Config) -> FlowGRPOView:
    return group_view(cfg, FlowGRPOPolicy)


def validate(cfg: Config) -> None:
    """Flow-GRPO's cross-field checks (ConfigError naming the key and the fix), in the order they report."""
    check_group_rl(cfg)
    tp, sample, ro = cfg.train.train_policy, cfg.policy.diffusers.sample, cfg.rollout
    n = sample.num_steps
    # its rollouts must be stochastic, so that their steps have log-probabilities
    if sample.solver not in STOCHASTIC_SOLVERS or sample.noise_level <= 0:
        raise ConfigError(
            f"flow_grpo needs stochastic rollouts with log-probabilities, but policy.diffusers.sample.solver = "
            f"{sample.solver!r} and noise_level = {sample.noise_level}; set solver = 'flow_sde' (or 'cps') and "
            "noise_level > 0 (e.g. 0.7)."
        )
    check_rollout_family(cfg)
    if sample.integer_timesteps:
        raise ConfigError(
            "policy.diffusers.sample.integer_timesteps = true is DiffusionNFT's / Sol-RL's rollout convention; "
            "flow_grpo feeds the float timestep in rollout and training alike (its log-prob ratios need the same "
            "model call in both): set it to false."
        )
    if tp.cps_train_last_step and (sample.solver != "cps" or tp.kl_beta > 0):
        raise ConfigError(
            f"train.train_policy.cps_train_last_step = true trains CPS's deterministic last step (flow_grpo's "
            f"divisor); it needs policy.diffusers.sample.solver = 'cps' (got {sample.solver!r}) and "
            f"train.train_policy.kl_beta = 0 (got {tp.kl_beta}: the KL divides by that step's std, 0)."
        )
    if ro.family != "diffusionnft" or ro.num_candidates not in (0, ro.n_generation):
        raise ConfigError(
            f"flow_grpo rolls out exactly rollout.n_generation samples per prompt with the trained policy; "
            f"rollout.family = {ro.family!r} / num_candidates = {ro.num_candidates} (Sol-RL's searches, for "
            "DiffusionNFT) do not apply: remove them (family = 'diffusionnft', num_candidates = 0)."
        )
    _check_guard(tp.ratio, sample.solver)
    _check_window(tp.sde_window_size, tp.sde_window_range, n, sample.solver)
    check_steps_per_rollout(cfg)
    if sample.solver == "cps" and tp.sde_window_size == 0 and n < 2:
        raise ConfigError(
            "with solver = 'cps' the last step lands on s' = 0 deterministically, so num_steps = 1 leaves no step "
            "to train; set policy.diffusers.sample.num_steps >= 2."
        )


def warnings(cfg: Config) -> list[str]:
    """Valid settings that have no effect for Flow-GRPO."""
    if cfg.policy.diffusers.sample.deterministic_sampling:
        return [
            "policy.diffusers.sample.deterministic_sampling = true has no effect for flow_grpo, whose rollouts "
            "always use the stochastic `solver`."
        ]
    return []


def _check_guard(ratio: str, solver: str) -> None:
    """GRPO-Guard's normalisation rests on the Gaussian log-density of the Flow-SDE step (its zero-mean identity
    needs `log p = -(x' - mu)^2 / (2 sigma^2) + const`); CPS's log-prob is another score, and Flow-Factory's
    GRPO-Guard is documented for its Flow-SDE dynamics only."""
    if ratio == "guard" and solver != "flow_sde":
        raise ConfigError(
            f"train.train_policy.ratio = 'guard' (GRPO-Guard) normalises the Gaussian log-probability of the "
            f"Flow-SDE step, but policy.diffusers.sample.solver = {solver!r}, whose log-prob is not that density "
            "(the reference defines GRPO-Guard on the Flow-SDE step only); set solver = 'flow_sde' (e.g. with "
            "noise_level = 0.7), or ratio = 'plain' to keep this solver."
        )


def _check_window(size: int, window_range: list[int], num_steps: int, solver: str) -> None:
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


def plan(cfg: Config) -> StepPlan:
    """The SDE steps each sample trains: Fast (sde_window_size > 0) every step of the window; else, as flow_grpo,
    the grid steps 0 .. int(num_steps x timesteps_fraction) - 1 (at least one), never CPS's deterministic last
    step to s' = 0 (trained only with cps_train_last_step)."""
    tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
    if tp.sde_window_size > 0:  # cps windows exclude the deterministic last step (validate)
        return StepPlan(levels=tp.sde_window_size, rule="every window step")
    n, fraction = sample.num_steps, cfg.policy.diffusers.timesteps_fraction
    random_steps = n - int(sample.solver == "cps" and not tp.cps_train_last_step)
    levels = min(random_steps, fraction_levels(n, fraction))
    return StepPlan(levels=levels, rule=f"max(1, int({n} x {fraction}))")


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward per trained SDE step (`plan`)."""
    return sde_work(cfg, guided, plan(cfg).levels)


def sde_work(cfg: Config, guided: GuidedRows, levels: int, data_rows: int = 0) -> TrainedWork:
    """`levels` trained forwards per sample, both CFG branches with cfg_in_training (and `data_rows` more rows
    in the same forward), and the reference's forward of the same rows with kl_beta."""
    tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
    policy = guided(1, sample.guidance_scale) if tp.cfg_in_training else 1
    rows = policy + data_rows
    return TrainedWork(levels=levels, rows=rows, frozen_rows=levels * rows * (1 if tp.kl_beta > 0 else 0))


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls) of `steps` optimizer steps: `train_batch_per_replica` per rollout."""
    rollouts = rollouts_for(cfg, steps)
    return rollouts * cfg.train.train_batch_per_replica, rollouts * cfg.train.train_batch_per_replica
