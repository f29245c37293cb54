"""The config view and checks DiffusionNFT and Flow-GRPO share (no torch: the registry imports these at config
load)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

from sanarl.config.checks import at_least, require
from sanarl.config.group_rl_schema import GroupPolicy, RolloutConfig
from sanarl.config.schema import Config, DiffusersConfig, LoraConfig
from sanarl.errors import ConfigError

Keys = TypeVar("Keys")


def keys_of(keys: type[Keys], section: Any) -> Keys:
    """The dataclass `keys` filled from the config section of the same field names: a view's narrow copy of the
    keys it reads (e.g. `GroupPolicy` from `[train.train_policy]`)."""
    return keys(**{f.name: getattr(section, f.name) for f in fields(keys)})


Policy = TypeVar("Policy", bound=GroupPolicy)


@dataclass(frozen=True)
class GroupRLView(Generic[Policy]):
    """What a group-RL method reads: its `[train.train_policy]` keys (a `GroupPolicy`), the rollout (group size, family; handed to
    the rollouts whole, with the diffusers section: sampler, noise level, timesteps_fraction) and the LoRA
    adapters (None: a full fine-tune, Flow-GRPO only)."""

    train_policy: Policy
    rollout: RolloutConfig
    diffusers: DiffusersConfig
    lora: LoraConfig | None


def group_sections(cfg: Config) -> tuple[RolloutConfig, DiffusersConfig, LoraConfig | None]:
    """The whole sections every group-RL view holds after its policy keys."""
    return cfg.rollout, cfg.policy.diffusers, cfg.policy.lora


def group_view(cfg: Config, policy: type[Policy]) -> GroupRLView[Policy]:
    """The view with the `[train.train_policy]` keys of `policy` (a method's `GroupPolicy` subclass)."""
    return GroupRLView(keys_of(policy, cfg.train.train_policy), *group_sections(cfg))


def check_group_rl(cfg: Config) -> None:
    """Prompt groups of K >= 2 that split the batch and at least one reward."""
    tp = cfg.train.train_policy
    k, batch = cfg.rollout.n_generation, cfg.train.train_batch_per_replica
    at_least(k, "rollout.n_generation", 2)
    require(
        batch % k == 0,
        f"train.train_batch_per_replica = {batch} is not a multiple of rollout.n_generation = {k} (the group "
        f"size); set train.train_batch_per_replica to a multiple of {k} or choose an n_generation that divides it.",
    )
    require(
        len(tp.remote_reward.reward_fns) > 0,
        "train.train_policy.type = 'grpo' needs a reward: add at least one "
        '[[train.train_policy.remote_reward.reward_fns]] table with name = "..." and weight = 1.0.',
    )


def check_rollout_family(cfg: Config) -> None:
    """Sol-RL rollout families: the draft count M >= K and the preview step."""
    ro = cfg.rollout
    m, k = ro.num_candidates, ro.n_generation
    if ro.family != "diffusionnft":
        require(
            m >= k,
            f"rollout.family = {ro.family!r} searches over rollout.num_candidates = M drafts per prompt and keeps "
            f"rollout.n_generation = {k}; set num_candidates >= {k} (Sol-RL uses 4 x K, e.g. {4 * k}).",
        )
    if ro.family == "sol_rl":
        steps = cfg.policy.diffusers.sample.num_steps
        require(
            1 <= ro.preview_step <= steps,
            f"rollout.preview_step = {ro.preview_step} must be between 1 and policy.diffusers.sample.num_steps = "
            f"{steps} (Sol-RL previews at 6 of 10 steps).",
        )


def check_steps_per_rollout(cfg: Config) -> None:
    """`optimizer_steps_per_rollout` fits the rollout's micro-batches and the checkpoint cadence (ConfigError)."""
    tp, k = cfg.train.train_policy, cfg.train.train_policy.optimizer_steps_per_rollout
    chunks = max(1, cfg.train.train_batch_per_replica // max(1, tp.mini_batch))
    if k > chunks:
        raise ConfigError(
            f"train.train_policy.optimizer_steps_per_rollout = {k} exceeds the {chunks} sample chunks of a rollout "
            f"(train_batch_per_replica {cfg.train.train_batch_per_replica} / mini_batch {tp.mini_batch}); lower it "
            "or raise train_batch_per_replica."
        )
    ckpt = cfg.train.ckpt
    if k > 1 and ckpt.enable_checkpoint and ckpt.save_freq % k:
        raise ConfigError(
            f"train.ckpt.save_freq = {ckpt.save_freq} is not a multiple of optimizer_steps_per_rollout = {k}: a "
            "checkpoint inside a rollout cannot resume it exactly. Set save_freq to a multiple of "
            f"{k} (e.g. {k * max(1, round(ckpt.save_freq / k))})."
        )


def rollouts_for(cfg: Config, steps: int) -> int:
    """Rollouts behind `steps` optimizer steps: one per `optimizer_steps_per_rollout`."""
    return -(-steps // cfg.train.train_policy.optimizer_steps_per_rollout)
