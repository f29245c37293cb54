"""The memory plan through the front door (issue 32; issue 30 item 9): `sanarl validate --gpus N --gpu NAME` prints
the per-rank breakdown, compute, time and a verdict without any weights; an unknown accelerator exits 2 with the
known list; a training run that cannot fit this machine stops with exit 2 before any model loads."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest


def _sanarl(*args: str, limit_gb: float | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250", "HF_HUB_OFFLINE": "1"}

    def cap():  # an address-space cap: a run that tries to allocate its way through fails instead of thrashing
        if limit_gb is not None:
            size = int(limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (size, size))

    return subprocess.run([sys.executable, "-m", "sanarl", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)  # fmt: skip


@pytest.mark.slow
def test_validate_prints_the_memory_plan_of_sana_sol_rl_on_8_h100():
    proc = _sanarl("validate", "--config", "sana-image-nft-sol_rl", "sanarl.datasets.diffusion_nft",
                   "--gpus", "8", "--gpu", "h100")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "memory plan: Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers on 8 rank(s), DDP" in out
    assert "transformer 1.605B parameters, trainable 22.94M (LoRA r=32, 22.94M per adapter)" in out
    for term in ("transformer weights (bfloat16)", "LoRA adapters x2 (float32)", "gemma-2-2b (bfloat16)",
                 "AdamW moments (2 x float32)", "EMA (float32)", "reward pickscore (float32)",
                 "inference copy (sol_rl, merged old adapter)", "rollout latents (6 prompts x 96 drafts, float32)",
                 "activations, forward + backward of 16 rows, checkpointing on", "gradients (float32)"):  # fmt: skip
        assert term in out, term
    assert "without gradient checkpointing" in out and "time per iteration on 8 x H100" in out
    assert "40% of the dense bf16 peak" in out
    assert "fits: peak" in out or "does not fit: peak" in out
    assert "weights for Efficient-Large-Model" in out  # validated without any weights here


def test_unknown_accelerator_exits_2_with_the_known_list():
    proc = _sanarl("validate", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes", "--gpu", "tpu-v5")
    assert proc.returncode == 2
    assert (
        "`--gpu tpu-v5` is not a known accelerator; known: h100, h200, b200, a100, l40s"
        in proc.stderr + proc.stdout
    )


def test_validate_names_the_options_that_make_a_run_fit():
    """A tiny run planned for a 0.1 GB accelerator does not fit; each option comes with its re-estimated peak."""
    proc = _sanarl("validate", "--config", "tiny-shapes-sft", "sanarl.datasets.shapes", "--gpu-memory", "0.1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "does not fit: peak" in out and "on a 0.1 GB accelerator; largest term: activations" in out
    assert "`--set policy.model_gradient_checkpointing=true`: peak" in out
    assert "`--set train.train_policy.mini_batch=" in out


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.diffusers.inference_size=[20000,20000]", "train.train_policy.mini_batch"),
        ("policy.lora.r=100000", "train.train_policy.mini_batch"),
        ("policy.diffusers.max_prompt_length=100000", "policy.diffusers.max_prompt_length"),
    ],
)
def test_a_run_that_cannot_fit_stops_before_loading(tmp_path, override, key):
    """The three configs of the fault audit: each exits 2 naming the peak, the largest term and its key, writes
    nothing, and stays far from the memory it would need (the address-space cap makes a run that went on to
    allocate fail instead of exhausting the machine)."""
    out_dir = tmp_path / "run"
    start = time.monotonic()
    proc = _sanarl("--config", "tiny-shapes-nft", "sanarl.datasets.shapes", "--set", override,
                   "--set", f"train.output_dir={out_dir}", limit_gb=6)  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr
    assert "this run needs about" in err and "GiB per rank" in err and f"`{key}`" in err
    assert "Fix:" in err and "Traceback" not in err
    assert not out_dir.exists()
    assert time.monotonic() - start < 300
