"""A tiny training run starts from one of Cosmos-RL's own presets (stored unchanged in tests/data/cosmos_rl/), with
the guide's launcher name and overrides that swap in the shipped tiny base and a CPU-sized batch."""

from __future__ import annotations

from pathlib import Path

PRESET = Path(__file__).resolve().parent.parent / "data" / "cosmos_rl" / "sana" / "sana-image-nft.toml"
TINY = {
    "policy.model_name_or_path": "sanarl-tiny:shapes-base",
    "policy.diffusers.inference_size": "[32,32]",
    "policy.diffusers.max_prompt_length": "16",
    "policy.diffusers.complex_human_instruction": "false",
    "policy.model_gradient_checkpointing": "false",
    "policy.diffusers.sample.num_steps": "2",
    "policy.parallelism.dp_shard_size": "1",
    "rollout.n_generation": "2",
    "rollout.batch_size": "4",
    "train.train_batch_per_replica": "4",
    "train.train_policy.mini_batch": "2",
    "train.train_policy.use_remote_reward": "false",
    "train.train_policy.remote_reward.reward_fns.0.name": "jpeg_compressibility",
    "train.param_dtype": "float32",
    "train.max_num_steps": "1",
    "logging.logger": "console",
}


def test_tiny_run_from_a_cosmos_rl_preset(run_cli, tmp_path):
    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    out_dir = tmp_path / "run"
    code, out, err = run_cli(
        "--config",
        str(PRESET),
        "cosmos_rl.tools.dataset.diffusion_nft",
        *sets,
        "--set",
        f"train.output_dir={out_dir}",
    )
    assert code == 0, err + out
    assert "done: 1 steps" in out
    assert "Cosmos-RL's launcher" in err and "Cosmos-RL trained on every timestep" in err
    resolved = (out_dir / "config.toml").read_text()
    assert 'backend = "diffusers"' in resolved and "timesteps_fraction = 0.99" in resolved
    assert (out_dir / "export").is_dir()


def test_a_reward_sanarl_cannot_score_stops_the_run_before_weights_load(run_cli, tmp_path):
    """SANA 1.5's weights are not here: the run must stop on the reward name, not on the missing weights."""
    code, _, err = run_cli(
        "--config",
        str(PRESET),
        "cosmos_rl.tools.dataset.diffusion_nft",
        "--set",
        "train.train_policy.use_remote_reward=false",
        "--set",
        "train.train_policy.remote_reward.reward_fns.0.name=image_reward",
        "--set",
        f"train.output_dir={tmp_path / 'run'}",
    )
    assert code == 2 and "reward `image_reward`" in err and "imagereward" in err
    assert "hf download" not in err and not (tmp_path / "run").exists()
