"""Config loading: strict typed build, ignored keys, aliases, `--set` overrides, cross-field checks, TOML round trip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from sanarl.config import (
    Config,
    LoadedConfig,
    LoraConfig,
    RewardFnConfig,
    apply_overrides,
    config_to_dict,
    dump_toml,
)
from sanarl.errors import ConfigError, UserError
from sanarl.methods.config_loading import check_config, load_config, loads_config

GRPO = [
    "train.train_policy.type=grpo",
    "train.train_policy.trainer_type=diffusion_nft",
    "rollout.n_generation=2",
    "train.train_batch_per_replica=4",
    "train.train_policy.remote_reward.reward_fns=[{name = 'pickscore'}]",
    "policy.lora.lora_names=default,old",
]
"""Overrides that turn the default (SFT) config into a valid DiffusionNFT one."""


def write(tmp_path: Path, text: str, name: str = "preset.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Files and TOML syntax
# ---------------------------------------------------------------------------------------------------------------


def test_empty_preset_gives_schema_defaults_and_absolute_source(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    loaded = load_config(path)
    assert isinstance(loaded, LoadedConfig)
    assert loaded.config == Config()
    assert loaded.ignored == [] and loaded.notes == []
    assert loaded.source == path.resolve()
    assert check_config(Config()) == []


def test_values_are_read_and_int_is_accepted_for_float(tmp_path: Path) -> None:
    text = '[train]\nepoch = 3\noptm_lr = 1\noptm_betas = [0, 0.5]\n[policy]\nmodel_name_or_path = "a/b"\n'
    cfg = load_config(write(tmp_path, text)).config
    assert cfg.train.epoch == 3
    assert cfg.train.optm_lr == 1.0 and type(cfg.train.optm_lr) is float
    assert cfg.train.optm_betas == [0.0, 0.5] and all(type(b) is float for b in cfg.train.optm_betas)
    assert cfg.policy.model_name_or_path == "a/b"
    assert cfg.train.seed == 42  # untouched default


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "preset.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert f"`{missing}` does not exist" in str(info.value)
    assert "--config" in str(info.value)
    assert isinstance(info.value, UserError) and info.value.exit_code == 2


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        load_config(tmp_path)


def test_malformed_toml_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\nepoch = 1\noptm_lr = = 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert f"malformed TOML in {path} at line 3, column 11: Invalid value" in msg
    assert "the line reads: `optm_lr = = 2`" in msg


def test_duplicate_table_is_a_toml_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\nepoch = 1\n[train]\nseed = 2\n")
    with pytest.raises(ConfigError, match="at line 3, column 7"):
        load_config(path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[logging]\nproject_name = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


# ---------------------------------------------------------------------------------------------------------------
# Unknown keys and types
# ---------------------------------------------------------------------------------------------------------------


def test_unknown_key_did_you_mean(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\noptm_lrr = 1e-4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert f"unknown key `train.optm_lrr` in {path}; did you mean `train.optm_lr`?" in msg
    assert "(valid keys of [train]: epoch, seed, train_batch_per_replica," in msg


def test_unknown_section_did_you_mean() -> None:
    with pytest.raises(ConfigError) as info:
        loads_config("[trian]\nepoch = 1\n", source="p.toml")
    msg = str(info.value)
    assert "unknown key `trian` in p.toml; did you mean `train`?" in msg
    assert "valid top-level sections: policy, rollout, train, validation, logging" in msg


def test_key_in_wrong_section_points_to_its_home() -> None:
    with pytest.raises(ConfigError, match=r"`r` belongs elsewhere: did you mean `policy\.lora\.r`\?"):
        loads_config("[policy]\nr = 8\n")


def test_unknown_key_without_a_close_match_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        loads_config("[rollout]\nzzzzzz = 1\n")
    msg = str(info.value)
    assert "did you mean" not in msg
    assert "valid keys of [rollout]: backend, n_generation, batch_size" in msg


def test_unknown_key_in_array_of_tables() -> None:
    text = '[[train.train_policy.remote_reward.reward_fns]]\nnme = "pickscore"\n'
    with pytest.raises(ConfigError) as info:
        loads_config(text)
    msg = str(info.value)
    assert "unknown key `train.train_policy.remote_reward.reward_fns[0].nme`" in msg
    assert "did you mean `train.train_policy.remote_reward.reward_fns[0].name`?" in msg
    assert "valid keys of [[train.train_policy.remote_reward.reward_fns]]: name, weight," in msg


@pytest.mark.parametrize(
    ("text", "key", "expected", "got"),
    [
        ("[train]\nepoch = 1.5", "train.epoch", "expected an integer", "got 1.5 (float)"),
        ("[train]\nseed = true", "train.seed", "expected an integer", "got True (boolean)"),
        ("[train]\noptm_lr = true", "train.optm_lr", "expected a number", "got True (boolean)"),
        ('[train]\noptm_lr = "1e-4"', "train.optm_lr", "expected a number", "got '1e-4' (string)"),
        ('[train]\noptm_betas = [0.9, "a"]', "train.optm_betas[1]", "expected a number", "got 'a' (string)"),
        ("[train]\nresume = 3", "train.resume", "expected a boolean (true/false) or a string", "got 3"),
        ('[logging]\nlogger = "console"', "logging.logger", "expected an array of strings", "(string)"),
        ("[policy]\nlora = 3", "policy.lora", "expected a table", "got 3 (integer)"),
        (
            "[policy]\nmodel_revision = 1",
            "policy.model_revision",
            "a string (leave the key out for none)",
            "1",
        ),
        ("policy = 1", "policy", "expected a table", "got 1 (integer)"),
        (
            "[train.train_policy.remote_reward]\nreward_fns = [1]",
            "train.train_policy.remote_reward.reward_fns[0]",
            "expected a table",
            "got 1",
        ),
    ],
)
def test_wrong_types_name_key_expected_and_got(text: str, key: str, expected: str, got: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(text, source="p.toml")
    msg = str(info.value)
    assert f"wrong type for `{key}` in p.toml" in msg
    assert expected in msg and got in msg


def test_bool_or_str_fields_take_either() -> None:
    cfg = loads_config('[train]\nresume = "ckpts/step_10"\n[policy.lora]\ninit_lora_weights = false\n').config
    assert cfg.train.resume == "ckpts/step_10"
    assert cfg.policy.lora is not None and cfg.policy.lora.init_lora_weights is False
    assert loads_config("[train]\nresume = true\n").config.train.resume is True


def test_lora_table_present_means_lora_on() -> None:
    assert loads_config("").config.policy.lora is None
    assert loads_config("[policy.lora]\n").config.policy.lora == LoraConfig()
    lora = loads_config("[policy.lora]\nr = 16\nlora_alpha = 32\n").config.policy.lora
    assert lora == LoraConfig(r=16, lora_alpha=32.0)


def test_reward_fns_array_of_tables() -> None:
    text = (
        "[[train.train_policy.remote_reward.reward_fns]]\n"
        'name = "pickscore"\nweight = 2\n'
        "[[train.train_policy.remote_reward.reward_fns]]\n"
        'name = "ocr"\nscore_key = "acc"\nclip_min = 0\nclip_max = 1.5\n'
    )
    fns = loads_config(text).config.train.train_policy.remote_reward.reward_fns
    assert fns == [
        RewardFnConfig(name="pickscore", weight=2.0),
        RewardFnConfig(name="ocr", score_key="acc", clip_min=0.0, clip_max=1.5),
    ]


# ---------------------------------------------------------------------------------------------------------------
# Ignored keys and aliases
# ---------------------------------------------------------------------------------------------------------------


def test_cosmos_infrastructure_keys_are_ignored_and_listed() -> None:
    text = (
        'redis = "12800"\nmode = "colocated"\n'
        "[policy.parallelism]\ndp_shard_size = 8\ntp_size = 1\n"
        "[rollout.parallelism]\ntp_size = 2\n"
        "[train]\nfsdp_offload = false\nasync_tp_enabled = true\nnon_text = false\n"
        "[train.train_policy]\nuncentralized_training = true\n"
    )
    loaded = loads_config(text)
    expected = Config()
    expected.train.train_batch_per_replica = 8  # Cosmos-RL's SFT batch is per rank: 1 x dp_shard_size 8
    assert loaded.config == expected
    assert loaded.ignored == [
        "redis",
        "mode",
        "policy.parallelism.dp_shard_size",
        "policy.parallelism.tp_size",
        "rollout.parallelism.tp_size",
        "train.fsdp_offload",
        "train.async_tp_enabled",
        "train.non_text",
        "train.train_policy.uncentralized_training",
    ]
    assert loaded.cosmos["policy.parallelism.dp_shard_size"] == 8 and loaded.cosmos["redis"] == "12800"


def test_keys_outside_cosmos_rl_schema_still_fail_with_did_you_mean() -> None:
    with pytest.raises(ConfigError, match="unknown key `train.fsdp_anything_new`"):
        loads_config("[train]\nfsdp_anything_new = 1\n")
    with pytest.raises(ConfigError, match="did you mean `train.fsdp_offload`"):
        loads_config("[train]\nfsdp_ofload = true\n")
    with pytest.raises(ConfigError, match="did you mean `policy.parallelism.dp_shard_size`"):
        loads_config("[policy.parallelism]\ndp_shard_sise = 8\n")


def test_alias_is_renamed_with_a_note() -> None:
    loaded = loads_config("[policy.diffusers]\ntimestep_fraction = 0.6\n", source="cosmos.toml")
    assert loaded.config.policy.diffusers.timesteps_fraction == 0.6
    assert len(loaded.notes) == 1
    assert loaded.notes[0].startswith("`timestep_fraction` is read as `timesteps_fraction`")
    assert "cosmos.toml" in loaded.notes[0]


def test_alias_and_canonical_both_given_is_an_error() -> None:
    text = "[policy.diffusers]\ntimestep_fraction = 0.6\ntimesteps_fraction = 0.5\n"
    with pytest.raises(ConfigError) as info:
        loads_config(text, source="p.toml")
    msg = str(info.value)
    assert "both `policy.diffusers.timestep_fraction` and `policy.diffusers.timesteps_fraction`" in msg
    assert "Keep only `policy.diffusers.timesteps_fraction`" in msg


def test_alias_and_ignored_key_in_overrides() -> None:
    loaded = loads_config("", ["policy.diffusers.timestep_fraction=0.25", "train.fsdp_offload=true"])
    assert loaded.config.policy.diffusers.timesteps_fraction == 0.25
    assert loaded.ignored == ["train.fsdp_offload"]
    assert loaded.cosmos == {"train.fsdp_offload": True}
    assert loaded.notes[0].startswith("`timestep_fraction` is read as `timesteps_fraction`")


# ---------------------------------------------------------------------------------------------------------------
# --set overrides
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "getter", "expected"),
    [
        ("train.compile=true", lambda c: c.train.compile, True),
        ("train.compile=YES", lambda c: c.train.compile, True),
        ("train.ema_enable=0", lambda c: c.train.ema_enable, False),
        ("train.seed=7", lambda c: c.train.seed, 7),
        ("train.optm_lr=3e-5", lambda c: c.train.optm_lr, 3e-5),
        ("train.optm_lr=1", lambda c: c.train.optm_lr, 1.0),
        (
            "policy.diffusers.inference_size=[512, 256]",
            lambda c: c.policy.diffusers.inference_size,
            [512, 256],
        ),
        ("policy.diffusers.inference_size=64,32", lambda c: c.policy.diffusers.inference_size, [64, 32]),
        ("train.optm_betas=0.5, 0.75", lambda c: c.train.optm_betas, [0.5, 0.75]),
        ("logging.logger=console,tensorboard", lambda c: c.logging.logger, ["console", "tensorboard"]),
        ("logging.logger=[]", lambda c: c.logging.logger, []),
        ("train.max_num_steps=none", lambda c: c.train.max_num_steps, None),
        ("train.max_num_steps=12", lambda c: c.train.max_num_steps, 12),
        ("policy.diffusers.sample.flow_shift=3", lambda c: c.policy.diffusers.sample.flow_shift, 3.0),
        ("train.resume=true", lambda c: c.train.resume, True),
        ("train.resume=out/ckpt=5", lambda c: c.train.resume, "out/ckpt=5"),
        ("logging.experiment_name=", lambda c: c.logging.experiment_name, ""),
        ('logging.experiment_name="a b"', lambda c: c.logging.experiment_name, "a b"),
        ("policy.model_name_or_path=org/model", lambda c: c.policy.model_name_or_path, "org/model"),
        ("policy.lora={r = 2, lora_alpha = 1}", lambda c: c.policy.lora, LoraConfig(r=2, lora_alpha=1.0)),
    ],
)
def test_override_values_are_parsed_against_the_field_type(override: str, getter, expected) -> None:
    value = getter(loads_config("[train]\nmax_num_steps = 5\n", [override]).config)
    assert value == expected and type(value) is type(expected)


def test_override_into_absent_lora_creates_defaults() -> None:
    cfg = loads_config("", ["policy.lora.r=8"]).config
    assert cfg.policy.lora == LoraConfig(r=8)
    assert loads_config("[policy.lora]\nr = 8\n", ["policy.lora=none"]).config.policy.lora is None


def test_override_of_reward_fns_by_index_and_inline_array() -> None:
    text = '[[train.train_policy.remote_reward.reward_fns]]\nname = "pickscore"\n'
    cfg = loads_config(text, ["train.train_policy.remote_reward.reward_fns.0.weight=0.5"]).config
    assert cfg.train.train_policy.remote_reward.reward_fns == [RewardFnConfig(name="pickscore", weight=0.5)]
    new = "train.train_policy.remote_reward.reward_fns=[{name = 'a'}, {name = 'b', weight = 3}]"
    fns = loads_config(text, [new]).config.train.train_policy.remote_reward.reward_fns
    assert fns == [RewardFnConfig(name="a"), RewardFnConfig(name="b", weight=3.0)]
    with pytest.raises(ConfigError, match=r"index must be an integer from 0 to 0"):
        loads_config(text, ["train.train_policy.remote_reward.reward_fns.1.weight=0.5"])


def test_precedence_override_beats_file_beats_default(tmp_path: Path) -> None:
    path = write(tmp_path, "[train]\nepoch = 3\nseed = 5\n")
    cfg = load_config(path, ["train.seed=9"]).config
    assert cfg.train.seed == 9  # override > file
    assert cfg.train.epoch == 3  # file > default (1)
    assert cfg.train.optm_lr == 1e-4  # default
    assert load_config(path, ["train.seed=1", "train.seed=2"]).config.train.seed == 2  # later override wins


def test_apply_overrides_returns_a_copy() -> None:
    base = Config()
    out = apply_overrides(base, ["train.seed=3", "logging.logger=wandb"])
    assert out.train.seed == 3 and out.logging.logger == ["wandb"]
    assert base == Config()


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("train.seed", ["malformed override `train.seed`", "expected the form `dotted.key=value`"]),
        ("=3", ["malformed override `=3`"]),
        (
            "train.optm_lrr=1",
            ["unknown key `train.optm_lrr` in --set `train.optm_lrr=1`", "did you mean `train.optm_lr`?"],
        ),
        ("polcy.lora.r=2", ["unknown key `polcy`", "did you mean `policy`?"]),
        ("train.epoch=1.5", ["wrong type for `train.epoch`", "expected an integer", "got `1.5`"]),
        ("train.epoch=none", ["wrong type for `train.epoch`", "expected an integer"]),
        ("train.compile=maybe", ["wrong type for `train.compile`", "expected a boolean (true/false)"]),
        ("train.optm_lr=fast", ["wrong type for `train.optm_lr`", "expected a number"]),
        ("train.optm_betas=0.9,x", ["wrong type for `train.optm_betas[1]`"]),
        ("train.max_num_steps=x", ["expected an integer or none"]),
        ("policy.lora={r = }", ["cannot parse the value of `policy.lora`", "expected a table or none"]),
        ("train.seed.x=1", ["`train.seed`", "not a section"]),
    ],
)
def test_override_errors(override: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config("", [override])
    for fragment in fragments:
        assert fragment in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Cross-field checks
# ---------------------------------------------------------------------------------------------------------------


def test_valid_grpo_config_passes() -> None:
    cfg = loads_config("", GRPO).config
    assert cfg.train.train_policy.type == "grpo"
    assert cfg.policy.lora is not None and cfg.policy.lora.lora_names == ["default", "old"]
    assert check_config(cfg) == []


def test_mini_batch_must_divide_train_batch() -> None:
    with pytest.raises(ConfigError) as info:
        loads_config("", ["train.train_batch_per_replica=10", "train.train_policy.mini_batch=4"])
    assert str(info.value).startswith(
        "train.train_batch_per_replica = 10 is not a multiple of train.train_policy.mini_batch = 4; "
        "set train.train_batch_per_replica to a multiple of 4 (e.g. 8 or 12)"
    )


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["train.train_policy.type=ppo"], ["`train.train_policy.type` = 'ppo'", "'sft', 'grpo'"]),
        (["train.train_policy.trainer_type=flow_grpo"], ["not valid for type = 'sft'", "'', 'soar'"]),
        (
            [*GRPO, "train.train_policy.trainer_type="],
            ["trainer_type` = '' is not valid for type = 'grpo'", "'diffusion_nft', 'flow_grpo'"],
        ),
        (["train.train_policy.mini_batch=0"], ["`train.train_policy.mini_batch` = 0", ">= 1"]),
        ([*GRPO, "rollout.n_generation=1"], ["`rollout.n_generation` = 1", ">= 2"]),
        (
            [*GRPO, "rollout.n_generation=3"],
            ["train.train_batch_per_replica = 4 is not a multiple of rollout.n_generation = 3"],
        ),
        ([*GRPO, "train.train_policy.remote_reward.reward_fns=[]"], ["needs a reward", "reward_fns"]),
        (
            [*GRPO, "train.train_policy.remote_reward.reward_fns=[{name = ' '}]"],
            ["`train.train_policy.remote_reward.reward_fns[0].name` is empty"],
        ),
        ([*GRPO, "policy.lora.lora_names=default"], ['lacks "old"', '["default", "old"]']),
        (["policy.lora.lora_names=main"], ['must contain "default"']),
        (["train.train_policy.kl_beta=-0.1"], ["`train.train_policy.kl_beta` = -0.1", ">= 0"]),
        (
            ["policy.diffusers.timesteps_fraction=0"],
            ["`policy.diffusers.timesteps_fraction` = 0.0", "(0, 1]"],
        ),
        (["policy.diffusers.timesteps_fraction=1.5"], ["timesteps_fraction` = 1.5"]),
        (
            ["policy.diffusers.inference_size=512"],
            ["`policy.diffusers.inference_size` = [512]", "[height, width]"],
        ),
        (["policy.diffusers.inference_size=512,0"], ["two positive integers"]),
        (["policy.diffusers.sample.solver=eulr"], ["solver` = 'eulr'", "did you mean 'euler'?", "'cps'"]),
        (["policy.diffusers.weighting_scheme=normal"], ["weighting_scheme` = 'normal'", "'cosmap'"]),
        (["policy.diffusers.dtype=fp16"], ["`policy.diffusers.dtype` = 'fp16'", "'bfloat16'"]),
        (["train.param_dtype=bf16"], ["`train.param_dtype` = 'bf16'"]),
        (["logging.logger=console,mlflow"], ["`logging.logger[1]` = 'mlflow'", "'tensorboard'"]),
        (["train.optm_name=adamw"], ["`train.optm_name` = 'adamw'", "did you mean 'AdamW'?"]),
        (["train.optm_lr=0"], ["`train.optm_lr` = 0.0", "in (0, 1.0]"]),
        (["train.ema_decay=1"], ["`train.ema_decay` = 1.0", "[0, 1)"]),
        (["policy.diffusers.weight_copy_decay_type=4"], ["weight_copy_decay_type` = 4", "0, 1, 2, 3"]),
        (
            ["policy.diffusers.weight_copy_decay_type=3"],
            ["weight_copy_decay_type` = 3", "custom_decay_step = 0"],
        ),
        (["train.ckpt.save_freq=0"], ["`train.ckpt.save_freq` = 0", ">= 1"]),
        (["policy.diffusers.sample.guidance_scale=-1"], ["guidance_scale` = -1.0", ">= 0"]),
        (
            ["train.train_policy.advantage_low=2", "train.train_policy.advantage_high=1"],
            ["advantage_low = 2.0 must be below advantage_high = 1.0"],
        ),
        (["policy.diffusers.caption_dropout=1.5"], ["caption_dropout` = 1.5", "[0, 1]"]),
        (
            [*GRPO, "train.train_policy.trainer_type=flow_grpo"],
            ["flow_grpo needs stochastic rollouts", "solver = 'flow_sde'"],
        ),
        (["train.optm_betas=0.9"], ["`train.optm_betas` = [0.9]", "two numbers in [0, 1)"]),
        (["train.optm_betas=0.9,1"], ["`train.optm_betas` = [0.9, 1.0]", "e.g. [0.9, 0.999]"]),
        (["train.optm_impl=fuse"], ["`train.optm_impl` = 'fuse'", "did you mean 'fused'?", "'for-loop'"]),
        (["policy.is_diffusers=false"], ["`policy.is_diffusers` = false is not supported; set it to true."]),
        (["policy.model_name_or_path= "], ["`policy.model_name_or_path` is empty", "sanarl-tiny:shapes"]),
        (["train.output_dir="], ['`train.output_dir` is empty; set a run directory, e.g. "./outputs/run".']),
        (["policy.lora.lora_names=default,default"], ['must contain "default"', "no duplicates"]),
        (
            [*GRPO, "train.train_policy.remote_reward.reward_fns=[{name = 'shapes', weight = nan}]"],
            ["`train.train_policy.remote_reward.reward_fns[0].weight` = nan must be a finite number"],
        ),
        (["train.train_policy.remote_reward.scale=inf"], ["`train.train_policy.remote_reward.scale` = inf"]),
        (["train.train_policy.sde_window_size=-1"], ["`train.train_policy.sde_window_size` = -1", ">= 0"]),
        (
            ["validation.guard.metrics=[{key = 'heldout/image/brightness', margin = -1}]"],
            ["`validation.guard.metrics[0].margin` = -1.0 is out of range; it must be >= 0."],
        ),
    ],
)
def test_cross_field_errors_name_key_and_fix(overrides: list[str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config("", overrides)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_check_config_directly_on_a_dataclass() -> None:
    cfg = Config()
    cfg.train.train_policy.mini_batch = 3
    with pytest.raises(ConfigError, match="mini_batch = 3"):
        check_config(cfg)


def test_flow_grpo_with_sde_passes_and_warns_about_deterministic_sampling() -> None:
    overrides = [
        *GRPO,
        "train.train_policy.trainer_type=flow_grpo",
        "policy.diffusers.sample.solver=flow_sde",
        "policy.diffusers.sample.noise_level=0.7",
    ]
    loaded = loads_config("", overrides)
    assert any("deterministic_sampling = true has no effect for flow_grpo" in n for n in loaded.notes)


def test_warnings_for_settings_without_effect_become_notes() -> None:
    text = '[train.train_policy]\ntype = "sft"\nkl_beta = 0.1\n[validation]\nval_before_train = true\n'
    loaded = loads_config(text)
    assert loaded.notes == [
        "train.train_policy.kl_beta = 0.1 has no effect for SFT; it is ignored.",
        "validation.val_before_train = true has no effect while validation.enable = false.",
    ]


# ---------------------------------------------------------------------------------------------------------------
# Dump and round trip
# ---------------------------------------------------------------------------------------------------------------


def rich_config() -> Config:
    cfg = loads_config("", GRPO).config
    cfg.train.resume = "ckpt/step_5"
    cfg.train.max_num_steps = 40
    cfg.train.epsilon = 1e-8
    cfg.policy.diffusers.sample.flow_shift = 3.0
    cfg.policy.diffusers.inference_size = [64, 32]
    cfg.logging.experiment_name = 'a"b\\c\nd\x01é\t'
    cfg.logging.logger = ["console", "tensorboard"]
    cfg.train.train_policy.remote_reward.reward_fns = [
        RewardFnConfig(name="pickscore", weight=0.5, clip_max=2.0),
        RewardFnConfig(name="ocr", score_key="acc"),
    ]
    cfg.train.train_policy.remote_reward.reward_clip_min = -1.0
    return cfg


@pytest.mark.parametrize("make", [Config, rich_config], ids=["defaults", "rich"])
def test_dump_then_load_gives_an_equal_config(make, tmp_path: Path) -> None:
    cfg = make()
    text = dump_toml(cfg)
    path = write(tmp_path, text, "resolved.toml")
    loaded = load_config(path)
    assert loaded.config == cfg
    assert loaded.ignored == []
    assert tomllib.loads(text)["train"]["seed"] == cfg.train.seed


def test_dump_format_details() -> None:
    text = dump_toml(rich_config())
    lines = text.splitlines()
    assert 'experiment_name = "a\\"b\\\\c\\nd\\u0001é\\t"' in lines
    assert "epsilon = 1e-08" in lines
    assert lines.count("[[train.train_policy.remote_reward.reward_fns]]") == 2
    assert "[policy.lora]" in lines
    assert "model_revision" not in text  # None omitted
    assert not any(line.startswith("clip_min") for line in lines) and "clip_max = 2.0" in lines
    assert "[policy.lora]" not in dump_toml(Config())  # no LoRA table when LoRA is off


def test_config_to_dict_is_plain_and_keeps_none() -> None:
    data = config_to_dict(rich_config())
    assert data["train"]["train_policy"]["remote_reward"]["reward_fns"][0] == {
        "name": "pickscore",
        "weight": 0.5,
        "score_key": "",
        "clip_min": None,
        "clip_max": 2.0,
        "options": {},
    }
    assert data["policy"]["model_revision"] is None
    assert data["policy"]["lora"]["lora_names"] == ["default", "old"]
