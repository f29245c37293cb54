"""`[train.train_policy.awm]`, AWM's config section (docs/algorithms.md, "AWM"; docs/awm.md), kept beside the schema
whose `TrainPolicyConfig.awm` it is (sanarl.config.schema re-exports it).

AWM also reads keys that already exist with the same meaning: `train.train_policy.kl_beta` (its beta, the KL to the
base), `train.train_policy.advantage_high` (its adv_clip_max), `train.train_policy.clip_range` and
`policy.diffusers.timesteps_fraction` (its timestep_fraction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from sanarl.config.choices import AwmEmaDecayType, AwmKLWeight, AwmLossType, AwmTimeType, AwmWeighting
from sanarl.config.ranges import Above, AtLeast, Within


@dataclass
class AWMConfig:
    """`[train.train_policy.awm]`: AWM's weighting, trained levels, advantage scale and EMA term (docs/algorithms.md,
    "AWM"; docs/awm.md). Checked against the grid by `sanarl/methods/awm/config.py` `check_awm_config`."""

    METHODS: ClassVar[tuple[str, ...]] = ("awm",)

    weighting: AwmWeighting = "ghuber"
    """Surrogate log-likelihood of a (level s, sample) from its flow-matching error e: uniform -e, t -s e, t2 -s^2 e,
    huber -(sqrt(e + 1e-10) - 1e-5) s, ghuber -((e + 1e-10)^p - 1e-10^p) s / p (the published run: ghuber)."""
    ghuber_power: Annotated[float, Above(0, "the published run uses 0.25")] = 0.25
    """p of the ghuber weighting."""
    loss_type: AwmLossType = "exp_first"
    """exp_first: one importance ratio per (level, sample); sum_first: one per sample, of its levels' mean."""
    time_type: AwmTimeType = "discrete_wo_init"
    """Trained grid steps, T strata drawn once per micro-batch with m = int(num_steps x timesteps_fraction):
    discrete_wo_init over [1, m] (never the pure-noise step 0), discrete over [0, m], discrete_with_init step 0 plus
    T - 1 strata of [1, m]."""
    train_timesteps: Annotated[int, AtLeast(1, "the published run trains 6")] = 6
    """T: the grid levels each sample trains per rollout (one forward of T x mini_batch rows)."""
    advantage_max: Annotated[float | None, Above(0, "the published run uses 1")] = 1.0
    """Advantages are clipped to [-C, C] (C = train.train_policy.advantage_high), then scaled by advantage_max / C
    (unset: no scaling)."""
    kl_weight: AwmKLWeight = "uniform"
    """Weight of the KL to the base (train.train_policy.kl_beta): uniform, or elbo 1 / (2 std(s)^2) with
    std(s) = 0.7 sqrt(s / (1 - min(s, 0.99)))."""
    ema_beta: Annotated[float, AtLeast(0, "0 turns the EMA term off")] = 0.0
    """Weight of the velocity KL to an EMA copy of the policy (LoRA adapter "ema"; the published run uses 1)."""
    kl_ema_weight: AwmKLWeight = "uniform"
    """Weight of the EMA term: uniform or elbo, as kl_weight."""
    kl_ema_decay: Annotated[float, Within(0, 1, high_open=True)] = 0.3
    """Decay d of the EMA copy, updated after each rollout's last optimizer step as ema = d ema + (1 - d) theta."""
    kl_ema_decay_type: AwmEmaDecayType = "linear"
    """linear: d = min(kl_ema_decay, 0.001 x optimizer steps done) (the published choice); constant: d = kl_ema_decay."""
