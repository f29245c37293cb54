"""What a run rejects after loading its models is found before, by `sanarl validate` and by the start of a run
(`sanarl.training.preflight`): exit code 2, a message naming the key and the fix, and no model built (the tiny
model cache stays empty). Run as users run them: `python -m sanarl ...` from an unrelated directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL_PLUGIN = """
import torch

class Small(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"prompt": "a red square", "image": torch.rand(3, 16, 16)}

def get_dataset(config):
    return Small()
"""

HIDE_WANDB = '''
import importlib.abc
import importlib.machinery
import sys


class HideWandb(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import wandb` fails as it does where wandb is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "wandb":
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError("No module named 'wandb'", name="wandb")

    def exec_module(self, module):
        raise ModuleNotFoundError("No module named 'wandb'", name="wandb")


sys.meta_path.insert(0, HideWandb())
'''


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sanarl(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    cache = tmp_path / "cache"
    environment = {**os.environ, "SANARL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", **env}
    for name in ("REMOTE_REWARD_TOKEN", "REMOTE_REWARD_ENQUEUE_URL", "REMOTE_REWARD_FETCH_URL"):
        if name not in env:
            environment.pop(name, None)
    cmd = [sys.executable, "-m", "sanarl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environment, cwd=tmp_path)


def _case(name: str, tmp_path: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """(CLI arguments after the command, extra environment, words the error must contain)."""
    shapes = ["--config", "tiny-shapes-sft", "sanarl.datasets.shapes", "--set", "train.max_num_steps=1"]
    nft = ["--config", "tiny-shapes-nft", "sanarl.datasets.shapes"]
    remote = [*nft, "--set", "train.train_policy.use_remote_reward=true"]
    if name == "logger":
        hide = tmp_path / "hide"
        hide.mkdir()
        (hide / "sitecustomize.py").write_text(HIDE_WANDB)
        path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
        args = [*shapes, "--set", 'logging.logger=["console","wandb"]']
        return args, {"PYTHONPATH": path}, ["logging.logger", "wandb", "pip install wandb"]
    if name == "output_dir":
        (tmp_path / "a_file").write_text("")
        args = [*shapes, "--set", f"train.output_dir={tmp_path / 'a_file' / 'run'}"]
        return args, {}, ["train.output_dir", "cannot be written", "--set train.output_dir="]
    if name == "sample_size":
        plugin = tmp_path / "small.py"
        plugin.write_text(SMALL_PLUGIN)
        args = ["--config", "tiny-shapes-sft", str(plugin)]
        return args, {}, [str(plugin), "16x16", "policy.diffusers.inference_size", "[32, 32]"]
    if name == "reward_weights":
        args = [*nft, "--set", 'validation.held_out_rewards=["aesthetic"]']
        ckpts = tmp_path / "no_ckpts"
        return args, {"SANARL_REWARD_CKPTS": str(ckpts)}, ["aesthetic", "mlp_path", "hf download"]
    if name == "accumulation":  # accelerate would divide each loss by 0: a NaN gradient norm at step 1
        args = ["--config", "tiny-shapes-grpo", "sanarl.datasets.shapes", "--set", "train.max_num_steps=1"]
        words = [
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS='0'",
            "train.train_policy.mini_batch = 32",
            "set it to 1",
        ]
        return args, {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "0"}, words
    if name == "remote_unset":
        return remote, {}, ["use_remote_reward", "REMOTE_REWARD_ENQUEUE_URL", "export it"]
    assert name == "remote_unreachable"
    url = f"http://127.0.0.1:{_closed_port()}/api/reward"
    env = {
        "REMOTE_REWARD_TOKEN": "t",
        "REMOTE_REWARD_ENQUEUE_URL": f"{url}/enqueue",
        "REMOTE_REWARD_FETCH_URL": f"{url}/pull",
    }
    return remote, env, ["does not answer /health", "sanarl-reward --config", "REMOTE_REWARD_ENQUEUE_URL"]


CASES = [
    "logger",
    "output_dir",
    "sample_size",
    "reward_weights",
    "remote_unset",
    "remote_unreachable",
    "accumulation",
]


def _assert_refused(done: subprocess.CompletedProcess, words: list[str], tmp_path: Path) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    for word in words:
        assert word in message, (word, message)
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "a model was built"


@pytest.mark.parametrize("case", CASES)
def test_validate_refuses_what_the_run_would_reject(case, tmp_path):
    args, env, words = _case(case, tmp_path)
    _assert_refused(_sanarl(tmp_path, "validate", *args, **env), words, tmp_path)


@pytest.mark.parametrize("case", ["sample_size", "logger", "remote_unreachable", "accumulation"])
def test_a_run_refuses_it_at_start_before_any_model_loads(case, tmp_path):
    args, env, words = _case(case, tmp_path)
    _assert_refused(_sanarl(tmp_path, *args, **env), words, tmp_path)
    assert not (tmp_path / "outputs").exists()


def test_validate_passes_the_embedded_default(tmp_path):
    done = _sanarl(tmp_path, "validate", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes")
    assert done.returncode == 0, done.stderr
    assert "valid" in done.stdout
