"""Cosmos-RL's world-model RL keys as data: its `[model.rl]` table (RLConfig of its wfm config, where DDRL's keys
live; docs/ddrl.md), each read as a sanarl key (`WFM_RL_RENAMED`) or accepted, dropped and reported
(`WFM_RL_NOT_APPLICABLE`). `cosmos_rl.move_wfm_rl` applies them when a file has a `[model.rl]` table."""

from __future__ import annotations

from sanarl.config.cosmos.key_table import NotApplicable, _group

WFM_RL_SOURCE = {
    "repository": "nvidia-cosmos/cosmos-rl",
    "path": "cosmos_rl/policy/config/wfm/__init__.py (RLConfig, RewardConfig)",
    "commit": "89f2e5b5c817d99a240f1194ce37239ceb6f058a",
}
"""Where the `[model.rl]` keys below were read."""

WFM_RL_RENAMED: dict[str, tuple[str, str]] = {
    "model.rl.num_rollout": ("rollout.n_generation", "the rollout group size"),
    "model.rl.sample_steps": ("policy.diffusers.sample.num_steps", "the rollout's sampling steps"),
    "model.rl.train_on": ("train.train_policy.ddrl.train_on", "the trained steps (-1 = a random one)"),
    "model.rl.update_ref_every_iter": (
        "train.train_policy.ddrl.update_ref_every_iter",
        "how often the KL reference becomes the policy",
    ),
    "model.rl.clip_ratio": ("train.train_policy.clip_range", "the PPO clip of the importance ratio"),
    "model.rl.kl_beta": ("train.train_policy.kl_beta", "the reverse-KL weight"),
    "model.rl.data_beta": ("train.train_policy.ddrl.data_beta", "the weight of the loss on data"),
    "model.rl.use_rl_sigma_and_noise": (
        "train.train_policy.ddrl.use_rl_sigma_and_noise",
        "the data term at the rollout's level and noise",
    ),
    "model.rl.data_on_first_only": (
        "train.train_policy.ddrl.data_on_first_only",
        "the data term once per rollout",
    ),
    "model.rl.exp_reward": ("train.train_policy.ddrl.exp_reward", "advantages -exp(-A)"),
    "model.rl.use_same_seed": (
        "train.train_policy.same_noise_per_group",
        "one initial noise per rollout group",
    ),
    "model.rl.guidance": (
        "policy.diffusers.sample.guidance_scale",
        "Cosmos-RL's guidance g gives cond + g (cond - uncond), sanarl's scale w = 1 + g (g = 0: no CFG, w = 1)",
    ),
    "model.rl.reward_config.adv_clip_max": ("train.train_policy.advantage_high", "the advantage clip"),
    "model.rl.reward_config.adv_clip_min": ("train.train_policy.advantage_low", "the advantage clip"),
}
"""Cosmos-RL `[model.rl]` key -> (sanarl key, what it is). Read from a `[model.rl]` table (cosmos_rl.move_wfm_rl)."""

_WFM_SAMPLER = (
    "Cosmos-Predict2.5's EDM sampler setting; sanarl's rollouts use policy.diffusers.sample.solver (flow_sde or "
    "cps) at noise_level"
)
_WFM_REWARDS = "rewards are the [[train.train_policy.remote_reward.reward_fns]] tables"

WFM_RL_NOT_APPLICABLE: dict[str, NotApplicable] = {
    "model.rl.enabled": NotApplicable(
        "RL is train.train_policy.type = 'grpo' with trainer_type = 'ddrl' (or 'flow_grpo')", True
    ),
    "model.rl.on_policy": NotApplicable("Flow-GRPO and DDRL always roll out with the current policy", True),
    **_group("model.rl", "solver_option s_churn s_t_max s_t_min s_noise", _WFM_SAMPLER),
    **_group(
        "model.rl",
        "min_num_conditional_frames max_num_conditional_frames",
        "Cosmos-Predict2.5's image / video conditioning; sanarl's video models generate from text",
        min_num_conditional_frames=0,
        max_num_conditional_frames=0,
    ),
    **_group(
        "model.rl.reward_config",
        "ALL_REWARD_MODELS aesthetic image_reward remote_reward fake_reward",
        _WFM_REWARDS,
    ),
}
"""`[model.rl]` keys that have no meaning in sanarl: accepted, dropped and reported (their sub-tables too)."""
