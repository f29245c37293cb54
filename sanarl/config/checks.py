"""The generic cross-field checks of the trainer config: ranges and consistency that every method shares.

Each raises `ConfigError` naming the key and the fix. The choices of Literal fields and the ranges declared on the
fields (`Annotated[int, AtLeast(1)]`, sanarl/config/ranges.py) are checked from their types by the engine
(`engine.Engine.check_choices`, first); what is here depends on more than one key, or on a condition. The checks
and warnings that concern one method are its own (`validate(cfg)` and `warnings(cfg)` in
sanarl/methods/<method>/config.py), which the loader reads off the method table it is handed (`method_rules.py`). The
order in which `loader.check_config` runs them is the order in which errors are reported.
"""

from __future__ import annotations

from sanarl.config.method_rules import MethodRules, MethodTable, rules_of, trainer_types
from sanarl.config.ranges import Range
from sanarl.config.schema import Config
from sanarl.errors import ConfigError


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def at_least(value: float, key: str, low: float, strict: bool = False) -> None:
    """The range check of a key whose bound depends on a condition or a method (declared ones: ranges.py)."""
    Range(low=low, low_open=strict).check(value, key)


def check_rewards(cfg: Config) -> None:
    """`[train.train_policy.remote_reward]`: each clip range below its top (the per-key rules are on the fields)."""
    rr = cfg.train.train_policy.remote_reward
    base = "train.train_policy.remote_reward"
    for i, fn in enumerate(rr.reward_fns):
        if fn.clip_min is not None and fn.clip_max is not None:
            require(
                fn.clip_min < fn.clip_max,
                f"`{base}.reward_fns[{i}]` ({fn.name}): clip_min = {fn.clip_min} must be below clip_max = "
                f"{fn.clip_max}; fix or remove one of them.",
            )
    if rr.reward_clip_min is not None and rr.reward_clip_max is not None:
        require(
            rr.reward_clip_min < rr.reward_clip_max,
            f"`{base}.reward_clip_min` = {rr.reward_clip_min} must be below reward_clip_max = "
            f"{rr.reward_clip_max}; fix or remove one of them.",
        )


def check_diffusers(cfg: Config) -> None:
    """`[policy.diffusers]` and its `[sample]` table."""
    d = cfg.policy.diffusers
    if d.weight_copy_decay_type == 3:
        require(
            d.custom_decay_step > 0 and d.custom_decay_value > 0,
            "`policy.diffusers.weight_copy_decay_type` = 3 ramps the old-adapter decay to custom_decay_value over "
            f"custom_decay_step optimizer steps; set both > 0 (got custom_decay_step = {d.custom_decay_step}, "
            f"custom_decay_value = {d.custom_decay_value}), e.g. --set policy.diffusers.custom_decay_step=100 "
            "--set policy.diffusers.custom_decay_value=0.5.",
        )
    sample = d.sample
    stochastic_eval = sample.eval_solver == "flow_sde"
    require(
        stochastic_eval == (sample.eval_noise_level > 0),
        f"`policy.diffusers.sample.eval_noise_level` = {sample.eval_noise_level} with eval_solver = "
        f"{sample.eval_solver!r}: the evaluation's noise applies to the flow_sde step only; set eval_solver = "
        '"flow_sde" with eval_noise_level > 0 (Sol-RL evaluates SANA at 0.7), or eval_noise_level = 0 for a '
        "noise-free ODE.",
    )
    if d.is_video:
        at_least(d.train_frames, "policy.diffusers.train_frames", 1)
        at_least(d.inference_frames, "policy.diffusers.inference_frames", 1)


def check_validation(cfg: Config) -> None:
    """`[validation.guard]`: its cross-field checks (the run keys' own rules are on their fields)."""
    v = cfg.validation
    v.guard.check(
        v.enable, v.held_out_rewards
    )  # [validation.guard]: its checks sit beside its fields (schema.GuardConfig.check)


def warnings(cfg: Config) -> list[str]:
    """Valid settings that have no effect, whatever the method."""
    out = []
    if cfg.validation.val_before_train and not cfg.validation.enable:
        out.append("validation.val_before_train = true has no effect while validation.enable = false.")
    return out


def check_task(cfg: Config, methods: MethodTable) -> MethodRules:
    """`[train.train_policy]`: the trainer is one of `methods` for the task type (its entry is returned); batch
    sizes and advantage clip."""
    tp = cfg.train.train_policy
    method = rules_of(cfg, methods)
    if method is None:
        trainers = trainer_types(methods).get(tp.type, ())
        raise ConfigError(
            f"`train.train_policy.trainer_type` = {tp.trainer_type!r} is not valid for type = {tp.type!r}; set it "
            f"to one of {', '.join(repr(t) for t in trainers)}"
            + (' ("" = plain SFT).' if tp.type == "sft" else ".")
        )
    batch, mini = cfg.train.train_batch_per_replica, tp.mini_batch
    examples = " or ".join(str(m) for m in (batch // mini * mini, (batch // mini + 1) * mini) if m > 0)
    require(
        batch % mini == 0,
        f"train.train_batch_per_replica = {batch} is not a multiple of train.train_policy.mini_batch = {mini}; "
        f"set train.train_batch_per_replica to a multiple of {mini} (e.g. {examples}) or choose a mini_batch "
        f"that divides {batch}.",
    )
    require(
        tp.advantage_low < tp.advantage_high,
        f"train.train_policy.advantage_low = {tp.advantage_low} must be below advantage_high = {tp.advantage_high};"
        " set e.g. advantage_low = -5.0 and advantage_high = 5.0.",
    )
    return method
