"""`[train.train_policy.mixgrpo]`, MixGRPO's config section (docs/algorithms.md, "MixGRPO"), kept beside the schema
whose `TrainPolicyConfig.mixgrpo` it is (sanarl.config.schema re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from sanarl.config.choices import MixTailSolver
from sanarl.config.ranges import AtLeast, Within


@dataclass
class MixGRPOConfig:
    """`[train.train_policy.mixgrpo]`: MixGRPO's sliding SDE window and the solver after it (docs/algorithms.md,
    "MixGRPO"; docs/mixgrpo.md); its policy term is Flow-GRPO's keys. Checked by `sanarl/methods/mixgrpo/config.py`
    `check_mixgrpo_config`."""

    METHODS: ClassVar[tuple[str, ...]] = ("mixgrpo",)

    window_size: Annotated[int, AtLeast(1, "MixGRPO's published runs use 4")] = 4
    """SDE (and trained) steps per rollout: the window [a, a + size), at most num_steps - 2 (MixGRPO: 4 of 25)."""
    stride: Annotated[int, AtLeast(0, "0 = the window stays at the first steps")] = 1
    """Grid steps the window start moves by every `interval` rollouts (MixGRPO's prog_overlap_step: 1)."""
    interval: Annotated[int, AtLeast(1)] = 25
    """Rollouts between two moves of the window (MixGRPO: 25; MixGRPO-Flash: 20)."""
    roll_back: bool = True
    """Past the last start (num_steps - 2) the window goes back to step 0 (false: it stays there, empty)."""
    tail_solver: MixTailSolver = "euler"
    """The ODE solver after the window: euler (MixGRPO) or dpm2, DPM-Solver++(2M) (MixGRPO-Flash)."""
    advantage_aggr: bool = True
    """MixGRPO's advantages: each reward normalised in its prompt group, (R - mean) / (torch.std + 1e-8), then summed
    with the rewards' weights; false: Flow-GRPO's normaliser of the combined reward (global_std, unbiased_std)."""
    compress_ratio: Annotated[float, Within(0, 1, low_open=True, hint="MixGRPO-Flash uses 0.4")] = 1.0
    """The dpm2 tail's step ratio r: after the window's end b it runs on int((N + 1 - b) r) levels (1 = the grid's
    own steps; needs sigma_grid = "linspace" below 1)."""
