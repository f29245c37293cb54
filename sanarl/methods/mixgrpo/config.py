"""MixGRPO's config view and checks (docs/algorithms.md, "MixGRPO"; docs/mixgrpo.md for the keys)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.checks import require
from sanarl.config.group_rl_schema import FlowGRPOPolicy
from sanarl.config.schema import Config, MixGRPOConfig
from sanarl.methods.flow_grpo.config import rollout_cost as flow_grpo_rollout_cost
from sanarl.methods.flow_grpo.config import sde_work
from sanarl.methods.flow_grpo.config import validate as flow_grpo_validate
from sanarl.methods.group_rl.config import GroupRLView, group_sections, keys_of
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

KEY = "train.train_policy.mixgrpo"


@dataclass(frozen=True)
class MixGRPOView(GroupRLView[FlowGRPOPolicy]):
    """Flow-GRPO's view (MixGRPO's loss is Flow-GRPO's), plus `[train.train_policy.mixgrpo]`."""

    mixgrpo: MixGRPOConfig


def view(cfg: Config) -> MixGRPOView:
    tp = cfg.train.train_policy
    return MixGRPOView(keys_of(FlowGRPOPolicy, tp), *group_sections(cfg), tp.mixgrpo)


def validate(cfg: Config) -> None:
    """MixGRPO's cross-field checks: its rollout's own (solver, no Fast window), Flow-GRPO's, then
    `[train.train_policy.mixgrpo]`."""
    tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
    require(
        sample.solver == "flow_sde",
        f"mixgrpo's window steps are Flow-GRPO's SDE steps, but policy.diffusers.sample.solver = {sample.solver!r}; "
        "set solver = 'flow_sde' (with noise_level > 0; MixGRPO uses 0.7).",
    )
    require(
        tp.sde_window_size == 0,
        f"train.train_policy.sde_window_size = {tp.sde_window_size} draws Flow-GRPO-Fast's random window, which "
        f"mixgrpo replaces by its sliding one; set sde_window_size = 0 and size the window with `{KEY}.window_size`.",
    )
    require(
        tp.ratio == "plain",
        "train.train_policy.ratio = 'guard' (GRPO-Guard) needs the old policy's step means, which MixGRPO's mixed "
        "rollout does not record; set ratio = 'plain' for trainer_type = 'mixgrpo', or trainer_type = 'flow_grpo' "
        "for GRPO-Guard.",
    )
    flow_grpo_validate(cfg)
    check_mixgrpo_config(cfg)


def check_mixgrpo_config(cfg: Config) -> None:
    """`[train.train_policy.mixgrpo]` against the grid (ConfigError naming the key and the fix)."""
    m, sample = cfg.train.train_policy.mixgrpo, cfg.policy.diffusers.sample
    n = sample.num_steps
    top = n - 2
    require(
        m.window_size <= top,
        f"`{KEY}.window_size` = {m.window_size} is larger than the grid allows: policy.diffusers.sample.num_steps "
        f"= {n} leaves {max(top, 0)} steps that can be stochastic (the last two never are); set window_size <= "
        f"{max(top, 0)} or num_steps >= {m.window_size + 2}.",
    )
    require(
        m.stride <= top,
        f"`{KEY}.stride` = {m.stride} moves the window past the last start {top} (num_steps - 2) in one move; set "
        f"stride <= {top} (MixGRPO uses 1; 0 keeps the window at the first steps).",
    )
    require(
        m.compress_ratio == 1.0 or m.tail_solver == "dpm2",
        f"`{KEY}.compress_ratio` = {m.compress_ratio} coarsens the DPM-Solver++(2M) tail, but tail_solver = "
        f"{m.tail_solver!r}; set tail_solver = 'dpm2' (MixGRPO-Flash) or compress_ratio = 1.0.",
    )
    require(
        m.compress_ratio == 1.0 or sample.sigma_grid == "linspace",
        f"`{KEY}.compress_ratio` = {m.compress_ratio} rebuilds the tail as shift(linspace(1 - b / N, 0, n), k), "
        f"MixGRPO's own grid, but policy.diffusers.sample.sigma_grid = {sample.sigma_grid!r}; set sigma_grid = "
        "'linspace' (with flow_shift = 3, MixGRPO's) or compress_ratio = 1.0.",
    )


def warnings(cfg: Config) -> list[str]:
    """Without roll back the window reaches the last start num_steps - 2 and stays there, empty: the rollouts after
    that train nothing."""
    m, tp = cfg.train.train_policy.mixgrpo, cfg.train.train_policy
    top, steps = cfg.policy.diffusers.sample.num_steps - 2, cfg.train.max_num_steps
    if m.roll_back or m.stride == 0 or steps is None:
        return []
    empty_from = -(-top // m.stride) * m.interval  # the first rollout whose window starts at num_steps - 2
    if steps <= empty_from * tp.optimizer_steps_per_rollout:
        return []
    return [
        f"`{KEY}.roll_back` = false: from rollout {empty_from} on the window starts at num_steps - 2 = {top} and is "
        f"empty, so the last {steps - empty_from * tp.optimizer_steps_per_rollout} of train.max_num_steps = {steps} "
        "optimizer steps train nothing; set roll_back = true, or lower max_num_steps."
    ]


def plan(cfg: Config) -> StepPlan:
    """Every step of the window (fewer where it meets the last start num_steps - 2; none when it starts there)."""
    m = cfg.train.train_policy.mixgrpo
    return StepPlan(levels=m.window_size, rule=f"the sliding window of {m.window_size} steps")


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """One trained forward per window step, as Flow-GRPO's."""
    return sde_work(cfg, guided, plan(cfg).levels)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls): Flow-GRPO's."""
    return flow_grpo_rollout_cost(cfg, steps)
