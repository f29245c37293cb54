"""`[train.train_policy.ddrl]`, DDRL's config section (docs/algorithms.md, "DDRL"), kept beside the schema whose
`TrainPolicyConfig.ddrl` it is (sanarl.config.schema re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from sanarl.config.choices import DataSource, DataWeighting
from sanarl.config.ranges import Above, AtLeast


@dataclass
class DDRLConfig:
    """`[train.train_policy.ddrl]`: DDRL's data term and steps (docs/algorithms.md, "DDRL"; docs/ddrl.md); its policy
    term is Flow-GRPO's keys. Checked by `sanarl/methods/ddrl/config.py` `check_ddrl_config`."""

    METHODS: ClassVar[tuple[str, ...]] = ("ddrl",)

    data_beta: Annotated[float, AtLeast(0)] = 0.01
    """Weight of the flow-matching loss on data (>= 0; Cosmos-RL's DDRL: 0.01; 0 = Flow-GRPO's objective)."""
    data_weighting: DataWeighting = "edm"
    """Per-sample weight of the data term at level s: edm = s^2 + (1 - s)^2 (Cosmos-RL's EDM x0 loss); uniform = 1."""
    data_source: DataSource = "dataset"
    """dataset: the plugin's SFT items (their captions are the prompts); synthetic: base-model samples per group."""
    use_rl_sigma_and_noise: bool = True
    """Data term at the trained step's sigma and the sample's initial noise (false: fresh draws of both)."""
    data_on_first_only: bool = False
    """Take the data term at the first trained step of a rollout only."""
    train_on: list[int] = field(default_factory=list)
    """Grid steps trained per rollout, -1 = one more drawn per rollout ([] = Flow-GRPO's rule; no Fast window)."""
    exp_reward: bool = False
    """Advantages A -> -exp(-A) before the clip (the paper's lambda)."""
    loss_scale: Annotated[float, Above(0, "Cosmos-RL's DDRL uses 10")] = 10.0
    """Multiplies the whole DDRL loss before the backward (Cosmos-RL's loss_scale: it acts under the grad-norm clip)."""
    update_ref_every_iter: Annotated[int, AtLeast(0)] = 0
    """Copy the policy into the KL reference every n optimizer steps (0 = the base; LoRA: adapter "ref")."""
