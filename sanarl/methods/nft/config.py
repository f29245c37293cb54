"""DiffusionNFT's config view and checks (docs/algorithms.md, "DiffusionNFT"; docs/nft.md for the keys)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.schema import Config, DiffusersConfig, LoraConfig, RolloutConfig, TrainPolicyConfig
from sanarl.errors import ConfigError
from sanarl.methods.group_config import check_steps_per_rollout, rollouts_for


@dataclass(frozen=True)
class NFTView:
    """The sections DiffusionNFT reads: the policy-gradient keys, the rollout (group size, family), the diffusers
    keys (nft_beta, timesteps_fraction, weight_copy_decay_type, the sampler) and the LoRA adapters."""

    train_policy: TrainPolicyConfig
    rollout: RolloutConfig
    diffusers: DiffusersConfig
    lora: LoraConfig | None


def view(cfg: Config) -> NFTView:
    return NFTView(cfg.train.train_policy, cfg.rollout, cfg.policy.diffusers, cfg.policy.lora)


def validate(cfg: Config) -> None:
    """DiffusionNFT's own cross-field checks (ConfigError naming the key and the fix)."""
    if view(cfg).lora is None:
        raise ConfigError(
            "trainer_type = 'diffusion_nft' trains a LoRA adapter against an 'old' one; add a [policy.lora] "
            'table (e.g. r = 4, lora_alpha = 4, lora_names = ["default", "old"]).'
        )
    check_steps_per_rollout(cfg)


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls) of `steps` optimizer steps: `train_batch_per_replica` samples per rollout,
    each scored once; a Sol-RL search family also generates and scores `num_candidates` drafts per prompt."""
    rollouts, batch, ro = rollouts_for(cfg, steps), cfg.train.train_batch_per_replica, cfg.rollout
    per_rollout = batch
    if ro.family == "sol_rl":
        per_rollout = (batch // ro.n_generation) * ((ro.num_candidates or ro.n_generation) + ro.n_generation)
    return rollouts * per_rollout, rollouts * per_rollout
