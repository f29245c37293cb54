"""Shipped presets and package data (sanarl/config/presets.py): name resolution from any directory, relative data
paths anchored per preset, `sanarl presets --copy`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sanarl.config.presets import (
    copy_preset,
    data_dir,
    preset_names,
    presets_dir,
    resolve_preset_path,
    shipped_presets,
)
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_presets_and_data_live_inside_the_package():
    package = ROOT / "sanarl"
    assert presets_dir() == package / "presets" and data_dir() == package / "data"
    assert "tiny-shapes-sft" in preset_names() and len(shipped_presets()) >= 20
    for base in ("tiny-shapes-base", "tiny-video-base"):
        assert (data_dir("models", base) / "model_index.json").is_file()
    assert (data_dir("datasets", "prompts", "pickscore") / "test.txt").is_file()
    assert (data_dir("accelerate") / "fsdp_8gpu.yaml").is_file()


def test_a_name_resolves_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spec in ("tiny-shapes-nft", "tiny-shapes-nft.toml"):
        assert resolve_preset_path(spec) == presets_dir() / "tiny-shapes-nft.toml"
    assert load_config("tiny-shapes-nft").source == presets_dir() / "tiny-shapes-nft.toml"


def test_a_local_file_wins_over_the_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-shapes-nft.toml").write_text("[train]\nepoch = 1\n")
    assert resolve_preset_path("tiny-shapes-nft.toml") == Path("tiny-shapes-nft.toml")


def test_the_repository_presets_path_names_the_shipped_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spelling in ("presets/tiny-shapes-nft.toml", "./presets/tiny-shapes-nft.toml"):
        assert resolve_preset_path(spelling) == presets_dir() / "tiny-shapes-nft.toml"
    assert load_config("presets/tiny-shapes-nft.toml").config.policy.model_name_or_path.startswith(
        "sanarl-tiny:"
    )


def test_another_missing_path_to_a_shipped_name_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"pass `--config tiny-shapes-nft`.*sanarl presets --copy"):
        load_config("configs/tiny-shapes-nft.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("no-such-preset")


def test_a_shipped_preset_reads_its_data_from_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("sana-video-nft").config
    assert cfg.train.train_policy.dataset.local_dir == str(data_dir("datasets", "prompts", "video_train.txt"))
    assert cfg.validation.dataset.local_dir == str(data_dir("datasets", "prompts", "video_test.txt"))


def test_every_shipped_local_dir_exists():
    for path in shipped_presets():
        cfg = load_config(path).config
        for local_dir in (cfg.train.train_policy.dataset.local_dir, cfg.validation.dataset.local_dir):
            assert not local_dir or Path(local_dir).exists(), (path.name, local_dir)


def test_a_user_preset_reads_relative_paths_against_its_own_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    preset = folder / "mine.toml"
    preset.write_text(
        '[policy]\nmodel_name_or_path = "./my-model"\n'
        '[train.train_policy.dataset]\nlocal_dir = "data/train"\n'
        '[validation.dataset]\nlocal_dir = "/abs/val"\n'
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(preset).config
    assert cfg.train.train_policy.dataset.local_dir == str(folder / "data/train")
    assert cfg.policy.model_name_or_path == str(folder / "./my-model")
    assert cfg.validation.dataset.local_dir == "/abs/val"
    assert cfg.train.output_dir == "./outputs/run"  # run outputs stay relative to the current directory
    # a --set value is the user's typing: relative to the current directory
    cfg = load_config(preset, ["train.train_policy.dataset.local_dir=here"]).config
    assert cfg.train.train_policy.dataset.local_dir == str(tmp_path / "here")


def test_a_hub_id_is_never_anchored(tmp_path):
    preset = tmp_path / "hub.toml"
    preset.write_text('[policy]\nmodel_name_or_path = "org/model"\n')
    assert load_config(preset).config.policy.model_name_or_path == "org/model"


def test_copy_writes_an_editable_preset_that_loads_the_same(tmp_path):
    target = copy_preset("sana-image-sft", tmp_path / "mine")
    assert target == tmp_path / "mine" / "sana-image-sft.toml"
    assert load_config(target).config == load_config("sana-image-sft").config
    assert f'local_dir = "{data_dir("datasets", "examples", "sft").as_posix()}"' in target.read_text()
    with pytest.raises(ConfigError, match="already exists"):
        copy_preset("sana-image-sft", tmp_path / "mine")
    with pytest.raises(ConfigError, match="not a shipped preset.*tiny-shapes-sft"):
        copy_preset("nope", tmp_path)


def test_the_reward_service_config_ships_and_resolves_by_name(tmp_path, monkeypatch):
    from reward_service.config import load_service_config, shipped_config

    monkeypatch.chdir(tmp_path)
    shipped = shipped_config("rewards")
    assert shipped == ROOT / "reward_service" / "configs" / "rewards.toml"
    assert load_service_config("rewards").source == str(shipped)
    with pytest.raises(ConfigError, match="sanarl-reward --config rewards"):
        load_service_config("no-such.toml")
