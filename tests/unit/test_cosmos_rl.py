"""Cosmos-RL drop-in: its whole config schema, its nine diffusion presets, its launcher names and reward names.

tests/data/cosmos_rl_schema.json lists every key of Cosmos-RL's config models (provenance inside: repository, path,
commit); tests/data/cosmos_rl/ holds the keys and values of its nine diffusion presets (provenance in each header).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from sanarl.config import resolve_plugin
from sanarl.config.cosmos import drop_in
from sanarl.config.engine import field_types as _hints
from sanarl.config.engine import section_class as _section_cls
from sanarl.config.loader import dump_toml
from sanarl.config.schema import Config
from sanarl.errors import ConfigError, PluginError
from sanarl.methods.config_loading import loads_config

DATA = Path(__file__).resolve().parent.parent / "data"
SCHEMA = json.loads((DATA / "cosmos_rl_schema.json").read_text())
PRESETS = sorted((DATA / "cosmos_rl").glob("*/*.toml"))
ROOT = Path(__file__).resolve().parents[2]


def sanarl_leaves() -> set[str]:
    out: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        for name, tp in _hints(cls).items():
            path = f"{prefix}.{name}" if prefix else name
            sub = _section_cls(tp)
            walk(sub, path) if sub else out.add(path)

    walk(Config, "")
    return out


# ---------------------------------------------------------------------------------------------------------------
# The schema table
# ---------------------------------------------------------------------------------------------------------------


def test_schema_data_names_the_source_the_table_was_read_from() -> None:
    prov = SCHEMA["provenance"]
    assert (prov["repository"], prov["path"], prov["commit"]) == (
        drop_in.SOURCE["repository"],
        drop_in.SOURCE["path"],
        drop_in.SOURCE["commit"],
    )
    assert len(SCHEMA["keys"]) > 300


def test_every_cosmos_rl_key_is_honoured_renamed_or_not_applicable() -> None:
    honoured = sanarl_leaves()
    uncovered = [
        key
        for key in SCHEMA["keys"]
        if key not in honoured and key not in drop_in.RENAMED and drop_in.treatment(key) is None
    ]
    assert uncovered == []
    # the table names no key Cosmos-RL lacks, and none that sanarl honours
    assert set(drop_in.NOT_APPLICABLE) <= set(SCHEMA["keys"])
    assert not set(drop_in.NOT_APPLICABLE) & honoured
    # renamed keys are Cosmos-RL keys, except the misspelling its presets use (a reported defect)
    assert [k for k in drop_in.RENAMED if k not in SCHEMA["keys"]] == ["policy.diffusers.timestep_fraction"]
    assert all(drop_in.NOT_APPLICABLE[k].instead for k in drop_in.NOT_APPLICABLE)


# Values for keys whose Cosmos-RL default TOML cannot write (None) or sanarl refuses (LLM defaults).
EXAMPLES: dict[str, Any] = {
    "policy.is_diffusers": True,
    "policy.model_name_or_path": "sanarl-tiny:shapes-base",
    "rollout.backend": "diffusion_nft_rollout",
    "train.train_policy.type": "grpo",
    "train.train_policy.trainer_type": "diffusion_nft",
    "train.train_policy.remote_reward.reward_fns.name": "jpeg_compressibility",
    "train.train_policy.remote_reward.reward_fns.score_key": "",
    "validation.remote_reward.reward_fns.name": "pickscore",
    "policy.lora.lora_names": ["default", "old"],
    "policy.lora.target_modules": ["to_q"],
    "policy.lora.init_lora_weights": "gaussian",
    "policy.diffusers.sample.solver": "euler",
    "train.optm_impl": "foreach",
    "train.ckpt.upload_s3": False,
    "train.seed": 7,
    "train.max_num_steps": 3,
    "rollout.n_generation_mini_batch": 4,
    "train.train_batch_per_replica": 32,
    "train.train_policy.mini_batch": 4,
    "train.train_policy.dataset.split": "train",
    "validation.dataset.split": "test",
    "validation.batch_size": 4,
    "logging.logger": ["console"],
    "logging.multi_modal_log_interval": 5,
    "logging.experiment_name": "x",
    "custom": {"anything": 1},
}
SFT_ONLY = {key for key, e in SCHEMA["keys"].items() if e["models"] == ["SFTDataConfig"]}


def _value(key: str, entry: dict[str, Any]) -> Any:
    if key in EXAMPLES:
        return EXAMPLES[key]
    text = entry["default"]
    if text.startswith("factory:lambda: "):
        text = text.removeprefix("factory:lambda: ")
    elif text.startswith("factory:"):
        return {"list": [], "dict": {}}[text.removeprefix("factory:")]
    value = ast.literal_eval(text) if text != "<required>" else None
    if isinstance(value, tuple):
        return list(value)
    if value is None:
        kind = entry["type"]
        for word, example in (
            ("bool", True),
            ("float", 0.5),
            ("int", 2),
            ("List", ["a"]),
            ("Dict", {}),
            ("str", "a"),
        ):
            if word in kind:
                return example
    return value


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys -> nested tables; arrays of tables (reward_fns) get one item."""
    arrays = {p for p, t in SCHEMA["tables"].items() if t["kind"] == "array"}
    root: dict[str, Any] = {}
    for key, value in flat.items():
        node, parts = root, key.split(".")
        prefix = ""
        for part in parts[:-1]:
            prefix = f"{prefix}.{part}" if prefix else part
            if prefix in arrays:
                node = node.setdefault(part, [{}])[0]
            else:
                node = node.setdefault(part, {})
        node[parts[-1]] = value
    return root


def _toml(tree: dict[str, Any]) -> str:
    from sanarl.config.toml_dump import toml_key as _toml_key
    from sanarl.config.toml_dump import toml_value as _toml_value

    lines: list[str] = []

    def emit(table: dict[str, Any], path: str) -> None:
        subs = {k: v for k, v in table.items() if isinstance(v, dict) and k != "custom"}
        arrays = {k: v for k, v in table.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
        if path:
            lines.append(f"[{path}]")
        for k, v in table.items():
            if k not in subs and k not in arrays:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in subs.items():
            emit(v, f"{path}.{k}" if path else k)
        for k, items in arrays.items():
            for item in items:
                lines.append(f"[[{path}.{k}]]")
                lines.extend(f"{_toml_key(a)} = {_toml_value(b)}" for a, b in item.items())

    emit(tree, "")
    return "\n".join(lines) + "\n"


def _check_loaded(flat: dict[str, Any], text: str) -> None:
    loaded = loads_config(text, source="cosmos-layout.toml")
    cfg, honoured = loaded.config, sanarl_leaves()
    dropped = {drop_in.strip_indices(k): v for k, v in loaded.cosmos.items()}
    for key, value in flat.items():
        renamed = key in drop_in.RENAMED
        key = drop_in.RENAMED[key][0] if renamed else key
        if not renamed and drop_in.treatment(key) is not None:
            assert dropped[key] == value, key
            continue
        assert key in honoured, key
        node: Any = cfg
        for part in key.split("."):
            node = node[0] if isinstance(node, list) else node
            node = getattr(node, part)
        mapped, _ = drop_in.map_value(key, value)
        assert node == mapped or node == pytest.approx(mapped), key


def test_toml_files_in_cosmos_rl_layout_using_every_key_load() -> None:
    """Two files (a DiffusionNFT one, an SFT one for SFT-only keys) use every key of Cosmos-RL's schema."""
    keys = SCHEMA["keys"]
    grpo = {k: _value(k, e) for k, e in keys.items() if k not in SFT_ONLY}
    sft = {k: _value(k, e) for k, e in keys.items() if k in SFT_ONLY}
    sft.update({"train.train_policy.type": "sft", "train.train_policy.trainer_type": "sft"})
    assert set(grpo) | set(sft) == set(keys)
    for flat in (grpo, sft):
        _check_loaded(flat, _toml(_nest(flat)))


def test_value_maps_and_refusals() -> None:
    loaded = loads_config(
        '[rollout]\nbackend = "diffusion_nft_rollout"\n[train]\nema_update_step_interval = 0\n'
        '[train.ckpt]\nmax_keep = -1\nsave_mode = "sync"\n[logging]\nexperiment_name = "None"\n'
    )
    cfg = loaded.config
    assert (cfg.rollout.backend, cfg.train.ema_update_step_interval, cfg.train.ckpt.max_keep) == (
        "diffusers",
        1,
        0,
    )
    assert cfg.logging.experiment_name == ""
    assert any("diffusion_nft_rollout" in n for n in loaded.notes)
    with pytest.raises(ConfigError, match="LLM rollout engine"):
        loads_config('[rollout]\nbackend = "vllm"\n')
    with pytest.raises(ConfigError, match="fraction of the total steps"):
        loads_config("[train]\noptm_warmup_steps = 0.1\n")
    with pytest.raises(ConfigError, match="per-module learning rates"):
        loads_config("[train.optm_lr]\nglobal = 1e-4\n")
    with pytest.raises(ConfigError, match="'all-linear'"):
        loads_config('[policy.lora]\ntarget_modules = "all-linear"\n')
    with pytest.raises(ConfigError, match="not one of Cosmos-RL's values"):
        loads_config('[train.ckpt]\nsave_mode = "later"\n')
    with pytest.raises(ConfigError, match="did you mean `train.ckpt.save_mode`"):
        loads_config('[train.ckpt]\nsave_mod = "async"\n')
    with pytest.raises(ConfigError, match="did you mean `vla.num_envs`"):
        loads_config("[vla]\nnum_env = 2\n")
    with pytest.raises(ConfigError, match="did you mean `policy.parallelism.dp_shard_size`"):
        loads_config("", ["policy.parallelism.dp_shard_sise=1"])
    with pytest.raises(ConfigError, match="expected a table"):
        loads_config("[train]\nfp8 = true\n")


def test_n_generation_mini_batch_wins_over_cosmos_rl_rollout_batch_size() -> None:
    loaded = loads_config("[rollout]\nbatch_size = 2\nn_generation_mini_batch = 6\n")
    assert loaded.config.rollout.batch_size == 6 and loaded.cosmos == {"rollout.batch_size": 2}
    assert "prompts per rollout request" in drop_in.report(loaded.cosmos)[0]
    assert loads_config("[rollout]\nbatch_size = 2\n").config.rollout.batch_size == 2


def test_a_left_out_type_that_cosmos_rl_would_infer_as_grpo_is_noted() -> None:
    loaded = loads_config("[train.train_policy]\nkl_beta = 0.1\nuncentralized_training = true\n")
    assert loaded.config.train.train_policy.type == "sft"
    assert any('Cosmos-RL would infer type = "grpo" from kl_beta' in note for note in loaded.notes)
    stated = loads_config('[train.train_policy]\ntype = "sft"\nkl_beta = 0.1\n')
    assert not any("would infer" in note for note in stated.notes)


def test_timestep_fraction_defect_is_reported_and_the_file_honoured() -> None:
    loaded = loads_config("[policy.diffusers]\ntimestep_fraction = 0.99\n")
    assert loaded.config.policy.diffusers.timesteps_fraction == 0.99
    assert "Cosmos-RL trained on every timestep" in loaded.notes[0]


def test_cosmos_rl_sft_batch_is_per_rank() -> None:
    text = "[train]\ntrain_batch_per_replica = 2\n[policy.parallelism]\ndp_shard_size = 4\n"
    loaded = loads_config(text)
    assert loaded.config.train.train_batch_per_replica == 8
    one = loads_config(text, ["policy.parallelism.dp_shard_size=1"])
    assert (
        one.config.train.train_batch_per_replica == 2 and one.cosmos["policy.parallelism.dp_shard_size"] == 1
    )
    # the resolved config written to the run dir reads back to the same global batch
    assert loads_config(dump_toml(loaded.config)).config.train.train_batch_per_replica == 8


def test_defaults_that_differ_from_cosmos_rl_are_listed_for_keys_the_file_leaves_out() -> None:
    text = (DATA / "cosmos_rl" / "sana" / "sana-image-nft.toml").read_text()
    loaded = loads_config(text, ["train.ckpt.max_keep=5"])
    diffs = drop_in.default_differences(loaded.config, loaded.given)
    assert "train.train_policy.remote_reward.reward_fns[0].clip_max = None (Cosmos-RL's: 5.0)" in diffs
    assert "validation.freq = 100 (Cosmos-RL's: 20)" in diffs
    # Cosmos-RL encodes SANA prompts without the complex human instruction (sanarl's default prepends it)
    assert "policy.diffusers.complex_human_instruction = True (Cosmos-RL's: False)" in diffs
    # set in the file (guidance_scale, timestep_fraction via its alias) or by --set (max_keep): not listed
    assert not [
        d for d in diffs if d.startswith(("policy.diffusers.sample.guidance_scale", "train.ckpt.max_keep"))
    ]
    assert not [d for d in diffs if d.startswith("policy.diffusers.timesteps_fraction")]
    assert (
        "train.ckpt.max_keep" in loaded.given
        and "train.train_policy.remote_reward.reward_fns[0].name" in loaded.given
    )


def test_not_applicable_values_are_reported_with_what_sanarl_does() -> None:
    lines = drop_in.report({"train.sync_weight_interval": 4, "train.ckpt.save_mode": "async"})
    assert any(line.startswith("not applicable: train.sync_weight_interval = 4.") for line in lines)
    assert any("warning: `train.sync_weight_interval` = 4" in line for line in lines)


# ---------------------------------------------------------------------------------------------------------------
# Launchers, prompt sets, rewards
# ---------------------------------------------------------------------------------------------------------------


def test_cosmos_rl_launchers_resolve_to_sanarl_plugins() -> None:
    seen: list[str] = []
    module = resolve_plugin("cosmos_rl.tools.dataset.diffusion_nft", notice=seen.append)
    assert module.__name__ == "sanarl.datasets.diffusion_nft" and len(seen) == 1
    module = resolve_plugin("./cosmos_rl/tools/dataset/diffusers_dataset.py", notice=seen.append)
    assert module.__name__ == "sanarl.datasets.diffusers_dataset"
    with pytest.raises(PluginError, match="Cosmos-Predict"):
        resolve_plugin("cosmos_rl.tools.dataset.wfm_rl")
    with pytest.raises(PluginError, match="LLM / VLA launchers"):
        resolve_plugin("cosmos_rl.tools.dataset.gsm8k_grpo")


def _rl_config(name: str, split: str = "train") -> Config:
    cfg = Config()
    cfg.train.train_policy.type = "grpo"
    cfg.train.train_policy.dataset.name, cfg.train.train_policy.dataset.split = name, split
    return cfg


def test_dance_grpo_t2v_uses_danceGRPO_prompts_when_given_else_a_noted_stand_in(
    tmp_path, monkeypatch
) -> None:
    from sanarl.datasets import diffusion_nft

    stand_in = diffusion_nft.get_dataset(_rl_config("dance_grpo_t2v"))
    assert len(stand_in) == 32 and "stand in" in stand_in.notes[0]
    (tmp_path / "prompts" / "dance_grpo_t2v").mkdir(parents=True)
    (tmp_path / "prompts" / "dance_grpo_t2v" / "test.txt").write_text("a dancer spins\na cat jumps\n")
    monkeypatch.setenv("SANARL_DATA_DIR", str(tmp_path))
    given = diffusion_nft.get_dataset(_rl_config("dance_grpo_t2v", "test"))
    assert [given[i]["prompt"] for i in range(2)] == ["a dancer spins", "a cat jumps"] and given.notes == []


def test_reward_lines_read_the_registry() -> None:
    lines = drop_in.reward_lines(["dance_grpo"], remote=False, known=["dance_grpo"])
    assert lines == ["reward `dance_grpo`: scored in-process."]
    with pytest.raises(ValueError, match="sanarl does not have in-process"):
        drop_in.reward_lines(["dance_grpo"], remote=False, known=["pickscore"])
    assert "Cosmos-RL reward service" in drop_in.reward_lines(["dance_grpo"], remote=True, known=[])[0]
    with pytest.raises(ValueError, match="sanarl's is `imagereward`"):
        drop_in.reward_lines(["image_reward"], remote=False, known=["imagereward"])
    assert (
        "did you mean `pickscore`" in drop_in.reward_lines(["pickscor"], remote=True, known=["pickscore"])[0]
    )


# ---------------------------------------------------------------------------------------------------------------
# The nine presets through `sanarl validate`, unchanged
# ---------------------------------------------------------------------------------------------------------------


def _validate_args(preset: Path) -> list[str]:
    if "sft" in preset.name:
        data = (
            ROOT
            / "sanarl"
            / "data"
            / "datasets"
            / "examples"
            / ("sft_video" if "video" in preset.name else "sft")
        )
        return [
            "cosmos_rl.tools.dataset.diffusers_dataset",
            "--set",
            f"train.train_policy.dataset.local_dir={data}",
            "--set",
            f"validation.dataset.local_dir={data}",
        ]
    return ["cosmos_rl.tools.dataset.diffusion_nft"]


def test_the_nine_presets_are_stored_with_provenance() -> None:
    assert len(PRESETS) == 9
    for preset in PRESETS:
        head = preset.read_text().splitlines()[0]
        assert "nvidia-cosmos/cosmos-rl" in head and drop_in.SOURCE["commit"] in head


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_cosmos_rl_preset_validates_unchanged(preset, run_cli, monkeypatch) -> None:
    for var in ("REMOTE_REWARD_TOKEN", "REMOTE_REWARD_ENQUEUE_URL", "REMOTE_REWARD_FETCH_URL"):
        monkeypatch.delenv(var, raising=False)
    code, out, err = run_cli("validate", "--config", str(preset), *_validate_args(preset))
    assert code == 0, err + out
    assert "valid" in out and "8 rank(s)" in out
    assert "not applicable:" in out and "Cosmos-RL's launcher" in out + err
    assert "defaults: keys this Cosmos-RL preset does not set" in out


def test_sft_presets_placeholder_data_dirs_stop_validate(run_cli) -> None:
    """Cosmos-RL's SFT presets name `local_validation_dir` / `local_dir`: validate says so before any weights load."""
    preset = DATA / "cosmos_rl" / "sana" / "sana-image-sft.toml"
    code, _, err = run_cli("validate", "--config", str(preset), "cosmos_rl.tools.dataset.diffusers_dataset")
    assert code == 2 and "train.train_policy.dataset.local_dir" in err and "local_validation_dir" in err
    args = _validate_args(preset)[:3]  # training data given, validation still the placeholder
    code, _, err = run_cli("validate", "--config", str(preset), *args)
    assert code == 2 and "validation.dataset.local_dir" in err and "local_dir" in err


def test_cosmos_rl_validation_prompt_file_is_read(run_cli, tmp_path) -> None:
    """Cosmos-RL's SFT validation set is a JSON array of {"prompt": ...} objects (not a folder)."""
    prompts = tmp_path / "val.json"
    prompts.write_text(json.dumps([{"prompt": "a red cube"}, {"prompt": "a blue ball"}]))
    preset = DATA / "cosmos_rl" / "sana" / "sana-image-sft.toml"
    args = [*_validate_args(preset)[:3], "--set", f"validation.dataset.local_dir={prompts}"]
    code, out, err = run_cli("validate", "--config", str(preset), *args)
    assert code == 0, err
    assert "2 validation prompts" in out
    prompts.write_text(json.dumps([{"text": "no prompt key"}]))
    code, _, err = run_cli("validate", "--config", str(preset), *args)
    assert code == 2 and "entry 0" in err and '"prompt"' in err


def test_validate_plans_with_the_overrides(run_cli) -> None:
    preset = DATA / "cosmos_rl" / "sana" / "sana-image-nft.toml"
    shrunk = ["--set", "train.train_batch_per_replica=72", "--set", "train.train_policy.mini_batch=8"]
    code, _, err = run_cli("validate", "--config", str(preset), *_validate_args(preset), *shrunk)
    assert code == 2 and "must split over 8 rank(s)" in err
    one = ["--set", "policy.parallelism.dp_shard_size=1"]
    code, out, err = run_cli("validate", "--config", str(preset), *_validate_args(preset), *shrunk, *one)
    assert code == 0, err
    assert "72 / 24 (n_generation) / 1 rank(s)" in out


def test_in_process_reward_that_sanarl_lacks_stops_validate(run_cli, monkeypatch) -> None:
    from sanarl.rewards import registry

    monkeypatch.setattr(registry, "_lazy", {k: v for k, v in registry._lazy.items() if k != "dance_grpo"})
    monkeypatch.setattr(registry, "_eager", {k: v for k, v in registry._eager.items() if k != "dance_grpo"})
    preset = DATA / "cosmos_rl" / "sana" / "sana-video-nft.toml"
    local = ["--set", "train.train_policy.use_remote_reward=false"]
    code, _, err = run_cli("validate", "--config", str(preset), *_validate_args(preset), *local)
    assert code == 2 and "reward `dance_grpo`" in err and "replace it" in err


def test_the_validate_commands_of_the_migration_guide_run(run_cli, monkeypatch) -> None:
    """docs/cosmos-rl.md's commands name Cosmos-RL's ./configs/ (here: the stored copies in tests/data/cosmos_rl)."""
    monkeypatch.chdir(ROOT)
    for var in ("REMOTE_REWARD_TOKEN", "REMOTE_REWARD_ENQUEUE_URL", "REMOTE_REWARD_FETCH_URL"):
        monkeypatch.delenv(var, raising=False)
    text = (ROOT / "docs" / "cosmos-rl.md").read_text()
    commands = [line for line in text.splitlines() if line.startswith("sanarl validate --config ./configs/")]
    assert len(commands) == 4
    for command in commands:
        args = command.replace("./configs/", f"{DATA / 'cosmos_rl'}/").split()[1:]
        code, out, err = run_cli(*args)
        assert code == 0 and "valid" in out, command + err


@pytest.mark.parametrize("name", ["pickscore", "ocr", "geneval", "drawbench", "dance_grpo_t2v"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_cosmos_rl_prompt_set_names_resolve_or_name_the_file_to_provide(name, split) -> None:
    """Cosmos-RL's diffusion_nft launcher knows pickscore, ocr, geneval, dance_grpo_t2v (its guide adds drawbench)."""
    from sanarl.datasets import diffusion_nft
    from sanarl.errors import DataError

    try:
        data = diffusion_nft.get_dataset(_rl_config(name, split))
    except DataError as err:
        message = str(err)
        assert split == "train" and name in ("ocr", "geneval", "drawbench"), message
        assert "train.txt" in message or "generated" in message, message
        return
    assert len(data) > 0 and isinstance(data[0]["prompt"], str)


# ---------------------------------------------------------------------------------------------------------------
# Cosmos-RL's world-model RL keys ([model.rl], DDRL)
# ---------------------------------------------------------------------------------------------------------------

# RLConfig and RewardConfig of cosmos_rl/policy/config/wfm/__init__.py (nvidia-cosmos/cosmos-rl, drop_in.WFM_RL_SOURCE)
WFM_RL_KEYS = (
    "enabled update_ref_every_iter num_rollout sample_steps train_on on_policy solver_option s_churn s_t_max s_t_min "
    "s_noise guidance min_num_conditional_frames max_num_conditional_frames clip_ratio kl_beta data_beta "
    "use_rl_sigma_and_noise data_on_first_only use_same_seed exp_reward"
).split() + [
    f"reward_config.{k}"
    for k in "ALL_REWARD_MODELS adv_clip_max adv_clip_min aesthetic image_reward remote_reward fake_reward".split()
]

# [model.rl] of configs/cosmos-predict2-5/cosmos-predict2-5-2b-720-reason-embedding-ddrl.toml, plus the keys it leaves
# at their defaults
COSMOS_DDRL = """
[model.rl]
sample_steps = 20
num_rollout = 8
train_on = [0,2,4,6,8,10,12,14,16,18]
update_ref_every_iter = 0
data_beta = 0.01
guidance = 0.0
kl_beta = 0.0
min_num_conditional_frames = 0
use_same_seed = false
clip_ratio = 0.0001
s_churn = 1.0
[model.rl.reward_config]
adv_clip_max = 5.0
adv_clip_min = -5.0
[model.rl.reward_config.remote_reward]
enabled = true
"""


def _ddrl_text(extra: str = "") -> str:
    text = (ROOT / "sanarl" / "presets" / "tiny-shapes-ddrl.toml").read_text()
    for key in (
        "num_steps = 10",
        "n_generation = 8",
        "sde_window_size = 3",
        "clip_range = 1e-5",
        "kl_beta = 0.0",
        "guidance_scale = 1.0",
    ):
        text = text.replace(key + "\n", "")  # the file leaves them to [model.rl]
    text = text.replace("advantage_low = -5.0\nadvantage_high = 5.0\n", "")
    return (
        text.replace("[train.train_policy.ddrl]\ndata_beta = 0.01\n", "[train.train_policy.ddrl]\n") + extra
    )


def test_every_wfm_rl_key_is_mapped_or_not_applicable() -> None:
    for key in WFM_RL_KEYS:
        path = f"model.rl.{key}"
        assert (path in drop_in.WFM_RL_RENAMED) != (drop_in.treatment(path) is not None), path
    honoured = sanarl_leaves()
    assert all(target in honoured for target, _ in drop_in.WFM_RL_RENAMED.values())


def test_cosmos_rl_ddrl_model_rl_table_is_read_into_sanarls_keys() -> None:
    loaded = loads_config(_ddrl_text(COSMOS_DDRL))
    cfg = loaded.config
    tp, d = cfg.train.train_policy, cfg.train.train_policy.ddrl
    assert cfg.policy.diffusers.sample.num_steps == 20 and cfg.rollout.n_generation == 8
    assert d.train_on == list(range(0, 20, 2)) and d.data_beta == 0.01 and d.update_ref_every_iter == 0
    assert tp.kl_beta == 0.0 and tp.clip_range == 1e-4 and not tp.same_noise_per_group
    assert (tp.advantage_low, tp.advantage_high) == (-5.0, 5.0)
    assert cfg.policy.diffusers.sample.guidance_scale == 1.0  # Cosmos-RL's guidance 0 = no CFG
    assert any(
        "`model.rl.guidance` is read as `policy.diffusers.sample.guidance_scale` = 1.0" in n
        for n in loaded.notes
    )
    assert set(loaded.ignored) == {
        "model.rl.min_num_conditional_frames",
        "model.rl.s_churn",
        "model.rl.reward_config.remote_reward",
    }
    lines = drop_in.report(loaded.cosmos)
    assert any("model.rl.s_churn = 1.0" in line and "EDM sampler" in line for line in lines)
    assert loaded.config.train.train_policy.trainer_type == "ddrl"


def test_cosmos_rl_guidance_becomes_one_plus_g() -> None:
    cfg = loads_config(_ddrl_text(COSMOS_DDRL.replace("guidance = 0.0", "guidance = 3.5"))).config
    assert cfg.policy.diffusers.sample.guidance_scale == 4.5


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (COSMOS_DDRL.replace("data_beta", "data_betta"), ["model.rl.data_betta", "did you mean `data_beta`"]),
        (COSMOS_DDRL.replace("adv_clip_max", "adv_clip_maxx"), ["model.rl.reward_config.adv_clip_maxx"]),
        ("[model]\nfsdp_shard_size = 8\n" + COSMOS_DDRL.replace("[model.rl]\n", "[model.rl]\n", 1),
         ["model.fsdp_shard_size", "only [model.rl]"]),
    ],
)  # fmt: skip
def test_bad_model_rl_tables_are_named(text, needles) -> None:
    with pytest.raises(ConfigError) as err:
        loads_config(_ddrl_text(text))
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_a_model_rl_key_also_given_as_sanarls_is_refused() -> None:
    text = _ddrl_text(COSMOS_DDRL).replace(
        "[train.train_policy.ddrl]\n", "[train.train_policy.ddrl]\ndata_beta = 0.1\n"
    )
    with pytest.raises(
        ConfigError, match="both `model.rl.data_beta` and `train.train_policy.ddrl.data_beta`"
    ):
        loads_config(text)
