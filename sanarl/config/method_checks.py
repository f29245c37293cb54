"""The cross-field checks that concern one method (SFT, SOAR, DiffusionNFT, Flow-GRPO) or the task choice.

One function per method, each self-contained (it reads the whole `Config`, returns when its method is not the
run's, raises `ConfigError` naming the key and the fix), importing only `sanarl.config.*` and `sanarl.errors`, so
that each can move next to its method's config. `loader.check_config` calls them between the generic checks of
`checks.py`; that order is the order in which errors are reported.
"""

from __future__ import annotations

from sanarl.config.checks import at_least, require
from sanarl.config.choices import TRAINERS_BY_TYPE
from sanarl.config.schema import Config


def check_task(cfg: Config) -> None:
    """`[train.train_policy]`: the trainer fits the task type; batch sizes, KL weight and advantage clip."""
    tp = cfg.train.train_policy
    trainers = TRAINERS_BY_TYPE[tp.type]
    require(
        tp.trainer_type in trainers,
        f"`train.train_policy.trainer_type` = {tp.trainer_type!r} is not valid for type = {tp.type!r}; set it to "
        f"one of {', '.join(repr(t) for t in trainers)}"
        + (' ("" = plain SFT).' if tp.type == "sft" else "."),
    )
    at_least(tp.mini_batch, "train.train_policy.mini_batch", 1)
    at_least(cfg.train.train_batch_per_replica, "train.train_batch_per_replica", 1)
    batch, mini = cfg.train.train_batch_per_replica, tp.mini_batch
    examples = " or ".join(str(m) for m in (batch // mini * mini, (batch // mini + 1) * mini) if m > 0)
    require(
        batch % mini == 0,
        f"train.train_batch_per_replica = {batch} is not a multiple of train.train_policy.mini_batch = {mini}; "
        f"set train.train_batch_per_replica to a multiple of {mini} (e.g. {examples}) or choose a mini_batch "
        f"that divides {batch}.",
    )
    at_least(tp.kl_beta, "train.train_policy.kl_beta", 0)
    require(
        tp.advantage_low < tp.advantage_high,
        f"train.train_policy.advantage_low = {tp.advantage_low} must be below advantage_high = {tp.advantage_high};"
        " set e.g. advantage_low = -5.0 and advantage_high = 5.0.",
    )


def check_group_rl(cfg: Config) -> None:
    """type = grpo (DiffusionNFT and Flow-GRPO): prompt groups, a reward, then each trainer's and the rollout
    family's checks."""
    tp = cfg.train.train_policy
    if tp.type != "grpo":
        return
    k, batch = cfg.rollout.n_generation, cfg.train.train_batch_per_replica
    at_least(k, "rollout.n_generation", 2)
    require(
        batch % k == 0,
        f"train.train_batch_per_replica = {batch} is not a multiple of rollout.n_generation = {k} (the group "
        f"size); set train.train_batch_per_replica to a multiple of {k} or choose an n_generation that divides it.",
    )
    at_least(cfg.rollout.batch_size, "rollout.batch_size", 1)
    require(
        len(tp.remote_reward.reward_fns) > 0,
        "train.train_policy.type = 'grpo' needs a reward: add at least one "
        '[[train.train_policy.remote_reward.reward_fns]] table with name = "..." and weight = 1.0.',
    )
    check_flow_grpo(cfg)
    check_diffusion_nft(cfg)
    check_rollout_family(cfg)
    require(
        tp.advantage_high > 0,
        f"train.train_policy.advantage_high = {tp.advantage_high} must be > 0 (it is DiffusionNFT's adv_clip_max C).",
    )


def check_flow_grpo(cfg: Config) -> None:
    """Flow-GRPO: its rollouts are stochastic, so that they have log-probabilities."""
    if cfg.train.train_policy.trainer_type != "flow_grpo":
        return
    sample = cfg.policy.diffusers.sample
    require(
        sample.solver in ("flow_sde", "cps") and sample.noise_level > 0,
        f"flow_grpo needs stochastic rollouts with log-probabilities, but policy.diffusers.sample.solver = "
        f"{sample.solver!r} and noise_level = {sample.noise_level}; set solver = 'flow_sde' (or 'cps') and "
        "noise_level > 0 (e.g. 0.7).",
    )


def check_diffusion_nft(cfg: Config) -> None:
    """DiffusionNFT: beta > 0 and the symmetric advantage clip [-C, C]."""
    tp = cfg.train.train_policy
    if tp.trainer_type != "diffusion_nft":
        return
    at_least(cfg.policy.diffusers.nft_beta, "policy.diffusers.nft_beta", 0, strict=True)
    # exactness (issue 16): DiffusionNFT clips symmetrically at C = advantage_high; a lower bound is not honoured
    require(
        tp.advantage_low == -tp.advantage_high,
        f"train.train_policy.advantage_low = {tp.advantage_low} has no effect for diffusion_nft, which clips "
        f"advantages to [-C, C] with C = advantage_high = {tp.advantage_high} (DiffusionNFT's adv_clip_max); "
        f"set advantage_low = {-tp.advantage_high} (or use adv_mode = 'positive_only' for A >= 0).",
    )


def check_diffusion_nft_lora(cfg: Config) -> None:
    """DiffusionNFT with LoRA keeps its behaviour policy in an adapter named "old"."""
    tp, lora = cfg.train.train_policy, cfg.policy.lora
    if lora is None or tp.type != "grpo" or tp.trainer_type != "diffusion_nft":
        return
    require(
        "old" in lora.lora_names,
        f'`policy.lora.lora_names` = {lora.lora_names!r} lacks "old": DiffusionNFT keeps its behaviour policy in '
        'an adapter named "old"; set lora_names = ["default", "old"].',
    )


def check_rollout_family(cfg: Config) -> None:
    """Sol-RL rollout families (group RL): reward threads, the draft count M >= K, the preview step."""
    ro = cfg.rollout
    at_least(ro.reward_workers, "rollout.reward_workers", 0)
    at_least(ro.reward_deadline_s, "rollout.reward_deadline_s", 0, strict=True)
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


def warnings(cfg: Config) -> list[str]:
    """Valid settings that have no effect for the run's method."""
    tp = cfg.train.train_policy
    out = []
    if tp.type == "sft" and tp.kl_beta > 0:
        out.append(f"train.train_policy.kl_beta = {tp.kl_beta} has no effect for SFT; it is ignored.")
    if tp.type == "sft" and (tp.use_remote_reward or tp.remote_reward.reward_fns):
        out.append(
            "train.train_policy.remote_reward / use_remote_reward have no effect for SFT; they are ignored."
        )
    if tp.trainer_type == "flow_grpo" and cfg.policy.diffusers.sample.deterministic_sampling:
        out.append(
            "policy.diffusers.sample.deterministic_sampling = true has no effect for flow_grpo, whose rollouts "
            "always use the stochastic `solver`."
        )
    return out
