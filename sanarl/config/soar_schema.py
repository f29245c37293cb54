"""`[train.train_policy.soar]`, SOAR's config section (docs/algorithms.md, "SOAR"), kept beside the schema whose
`TrainPolicyConfig.soar` it is (sanarl.config.schema re-exports it). Its cross-field check is in
sanarl/methods/soar/config.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from sanarl.config.choices import LevelGrid, SoarRolloutType
from sanarl.config.ranges import AtLeast


@dataclass
class SoarConfig:
    """`[train.train_policy.soar]`: SOAR self-correction (docs/algorithms.md, "SOAR")."""

    METHODS: ClassVar[tuple[str, ...]] = ("soar",)

    lambda_aux: Annotated[float, AtLeast(0, "0 = plain flow matching; default 1.0")] = 1.0
    """Weight of the auxiliary corrective loss."""
    num_rollout_paths: Annotated[int, AtLeast(1, "1 = the ODE path only, the default")] = 1
    """M: one ODE path plus M - 1 stochastic paths."""
    trajectory_length: Annotated[int, AtLeast(1, "auxiliary points per path; default 6")] = 6
    """P: auxiliary points per path."""
    num_sampling_steps: Annotated[int, AtLeast(1, "the rollout step is 1/N in t; 40")] = 40
    """The one-step rollout moves by 1 / num_sampling_steps in t."""
    sde_rollout_type: SoarRolloutType = "flow_sde"
    """The step of the stochastic paths."""
    sde_noise_scale: Annotated[float, AtLeast(0, "default 0.5")] = 0.5
    """Noise scale (eta) of the stochastic paths."""
    cfg_scale_sampling: float = 4.5
    """CFG weight of the rollout velocity (computed without gradient)."""
    sigma_upper_ratio: Annotated[float, AtLeast(1, "so that s_up >= s1; default 1.5")] = 1.5
    """Auxiliary sigmas are drawn from U[s1, min(ratio * s0, 1)] (the public code hard-codes 1; sanarl honours it)."""
    boundary_aux_points: bool = True
    """Samples at the t1 = 0 boundary keep the ODE path's auxiliary points, as HY-SOAR; false drops them (their
    targets (z' - z0) / s' divide the rollout error by s' near 0; docs/algorithms.md, "SOAR")."""
    level_grid: LevelGrid = "scheduler_table"
    """How s0 and s1 are read off u and t1: scheduler_table (HY-SOAR: the scheduler's 1000-level sigma table at
    index trunc((1 - t) 1000)) | continuous (s = shift(t); docs/algorithms.md, "Deliberate differences")."""
