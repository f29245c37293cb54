"""`[train.train_policy.dpo]`, Diffusion-DPO's config section (docs/algorithms.md, "Diffusion-DPO"), kept beside
the schema whose `TrainPolicyConfig.dpo` it is (sanarl.config.schema re-exports it). Both DPO methods read it: the
offline one (`type = "sft"`, pairs from a dataset plugin) and the online one (`type = "grpo"`, the best and worst
sample of each rollout group). The trained level is drawn with the flow-matching keys of `[policy.diffusers]`
(`weighting_scheme`, `logit_mean`, `logit_std`, `mode_scale`), as SFT draws it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from sanarl.config.ranges import Above


@dataclass
class DPOConfig:
    """`[train.train_policy.dpo]`: the preference loss's temperature (docs/dpo.md)."""

    METHODS: ClassVar[tuple[str, ...]] = ("dpo", "dpo_online")

    beta_dpo: Annotated[
        float, Above(0, "DiffusionDPO's SD1.5 / SDXL runs use 5000; Flow-Factory's online SD3.5 run 100")
    ] = 5000.0
    """beta of the DPO loss -log sigmoid(-beta / 2 ((err_w - ref_w) - (err_l - ref_l))) (DiffusionDPO's beta_dpo)."""
