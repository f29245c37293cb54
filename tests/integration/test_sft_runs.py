"""SFT and LoRA-SFT on the tiny pixel-space SANA, end to end on CPU (seconds each)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sanarl import api
from sanarl.methods.config_loading import load_config, loads_config
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml"
SQUARES = str(ROOT / "tests" / "data" / "plugins" / "squares.py")


def overrides(out: Path, steps: int, *extra: str) -> list[str]:
    return [
        f"train.output_dir={out}",
        f"train.max_num_steps={steps}",
        "train.epoch=1000",
        "train.train_batch_per_replica=8",
        "train.train_policy.mini_batch=4",
        "train.optm_warmup_steps=0",
        "train.ema_enable=false",
        "train.ckpt.save_freq=4",
        "train.ckpt.max_keep=0",
        "validation.enable=false",
        "validation.val_before_train=false",
        "logging.log_freq=1",
        *extra,
    ]


def run(out: Path, steps: int, *extra: str) -> api.TrainOutcome:
    return api.train(load_config(PRESET, overrides(out, steps, *extra)), SQUARES)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """A 12-step full fine-tune with validation grids and export."""
    out = tmp_path_factory.mktemp("full")
    from sanarl.models import load_adapter

    initial = {
        k: v.clone()
        for k, v in load_adapter(load_config(PRESET).config.policy).transformer.state_dict().items()
    }
    outcome = run(
        out,
        12,
        "validation.enable=true",
        "validation.val_before_train=true",
        "validation.freq=6",
        "validation.num_samples=4",
        "validation.batch_size=4",
        "policy.diffusers.sample.eval_num_steps=4",
    )
    return out, outcome, initial


def test_full_run_writes_config_metrics_samples_checkpoints(full_run):
    out, outcome, _ = full_run
    assert outcome.result.steps == 12
    reloaded = load_config(out / "config.toml").config
    assert reloaded == outcome.cfg
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 and r["lr"] == pytest.approx(1e-3) for r in records)
    assert sorted(p.name for p in (out / "samples").glob("*.png")) == [
        "step_00000000.png",
        "step_00000006.png",
        "step_00000012.png",
    ]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_00000004",
        "step_00000008",
        "step_00000012",
    ]
    assert (out / "metrics.png").is_file()


def test_full_run_changes_every_trained_tensor_and_exports_a_pipeline(full_run):
    out, outcome, initial = full_run
    trained = outcome.task.adapter.transformer.state_dict()
    changed = [k for k in initial if not torch.equal(initial[k], trained[k])]
    assert len(changed) >= 0.9 * len(
        initial
    )  # every weight gets gradient; a few (e.g. unused biases) may not move

    from diffusers import DiffusionPipeline

    import sanarl.models.pixel_ae  # noqa: F401  (registers the tiny VAE class for diffusers)

    pipe = DiffusionPipeline.from_pretrained(str(out / "export"))
    exported = pipe.transformer.state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    ckpt = load_file(str(out / "checkpoints" / "step_00000012" / "model.safetensors"))
    assert all(torch.equal(ckpt[k], trained[k]) for k in trained)


def test_loss_falls(tmp_path):
    outcome = run(tmp_path, 40, "train.train_batch_per_replica=16", "train.train_policy.mini_batch=16")
    losses = [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < 0.75 * first, (first, last)
    assert outcome.result.steps == 40


def test_lora_sft_trains_only_the_adapter_and_exports_a_diffusers_lora(tmp_path):
    from sanarl.core.lora import adapter_parameters
    from sanarl.models import load_adapter

    cfg = load_config(
        PRESET, overrides(tmp_path, 8, "policy.lora.r=4", "policy.lora.init_lora_weights=gaussian")
    )
    base = load_adapter(cfg.config.policy).transformer.state_dict()
    outcome = api.train(cfg, SQUARES)
    module = outcome.task.adapter.transformer
    lora = adapter_parameters(module, "default")
    assert lora and all(p.requires_grad for p in lora.values())
    for name, p in module.named_parameters():
        if "lora_" not in name:
            assert not p.requires_grad
            assert torch.equal(p, base[name.replace(".base_layer", "")]), name
    lora_b = [p for k, p in lora.items() if "lora_B" in k]
    assert any(p.abs().max() > 0 for p in lora_b)  # B starts at zero; training moved it

    from diffusers import SanaPipeline

    import sanarl.models.pixel_ae  # noqa: F401
    from sanarl.models.weight_sources import resolve_weights

    pipe = SanaPipeline.from_pretrained(str(resolve_weights(cfg.config.policy.model_name_or_path)))
    pipe.load_lora_weights(str(tmp_path / "export"))
    loaded = {k: p for k, p in pipe.transformer.named_parameters() if "lora_" in k}
    assert len(loaded) == len(lora)
    for key, p in lora.items():
        assert torch.equal(loaded[key.replace(".default.", ".default_0.")], p.detach()), key


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    """8 samples as 1 x 8 and as 4 x 2 micro-batches give the same update (docs/algorithms.md, "SFT").

    SGD, so the update is linear in the gradient (Adam's first step is sign-like and amplifies float noise)."""
    from sanarl.models import load_adapter

    a_init = load_adapter(load_config(PRESET).config.policy).transformer.state_dict()
    common = (
        "train.optm_grad_norm_clip=0",
        "train.optm_name=SGD",
        "train.optm_lr=0.1",
        "train.optm_weight_decay=0",
    )
    a = run(tmp_path / "a", 1, "train.train_policy.mini_batch=8", *common)
    b = run(tmp_path / "b", 1, "train.train_policy.mini_batch=2", *common)
    wa, wb = a.task.adapter.transformer.state_dict(), b.task.adapter.transformer.state_dict()
    moved = max((wa[k] - a_init[k]).abs().max().item() for k in wa)
    assert moved > 1e-3
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6 * max(1.0, moved * 100)


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    killed = tmp_path / "killed"
    args = ["--config", str(PRESET), SQUARES, *sum((["--set", o] for o in overrides(killed, 100000)), [])]
    args += ["--set", "train.ckpt.save_freq=3", "--set", "train.resume=true"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sanarl", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 240
    while time.time() < deadline and not (killed / "checkpoints" / "step_00000003").is_dir():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    newest = max(
        int(p.name.split("_")[1]) for p in (killed / "checkpoints").iterdir() if p.name.startswith("step_")
    )
    target = newest + 3
    resumed = run(killed, target, "train.resume=true", "train.ckpt.save_freq=3")
    straight = run(tmp_path / "straight", target, "train.ckpt.save_freq=3")
    wa = resumed.task.adapter.transformer.state_dict()
    wb = straight.task.adapter.transformer.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == list(range(1, target + 1))
    last_a = read_metrics(killed / "metrics.jsonl")[-1]
    last_b = read_metrics(tmp_path / "straight" / "metrics.jsonl")[-1]
    assert last_a["step"] == last_b["step"] == target and last_a["loss"] == last_b["loss"]


def test_config_written_is_the_resolved_one(tmp_path):
    outcome = run(tmp_path, 1, "train.optm_lr=0.0005")
    text = (tmp_path / "config.toml").read_text()
    assert loads_config(text).config.train.optm_lr == 0.0005
    assert json.loads(json.dumps(outcome.plan))  # the plan is plain data


def test_a_failing_validation_keeps_the_checkpoint_of_its_step(tmp_path, monkeypatch):
    """Without the reward-hacking guard a step's checkpoint is written before its validation: a validation that
    crashes (here at step 4) leaves the step-4 checkpoint to resume from."""
    from sanarl.training.validation import Validation

    def crash(self, step, logger):
        raise RuntimeError(f"validation failed at step {step}")

    monkeypatch.setattr(Validation, "sample", crash)
    out = tmp_path / "run"
    extra = (
        "validation.enable=true",
        "validation.freq=4",
        "validation.num_samples=2",
        "validation.batch_size=2",
    )
    with pytest.raises(RuntimeError, match="step 4"):
        run(out, 8, *extra)
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_00000004"]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
