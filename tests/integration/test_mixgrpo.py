"""MixGRPO end to end on the tiny SANA (CPU; docs/algorithms.md, "MixGRPO"): the shipped preset from the command line
(its window slides, step by step), the window's steps are the stored and trained ones over a whole schedule (roll
back, a window cut at num_steps - 2, an empty one) with the DPM-Solver++(2M) tail, the trained loss and its gradient
against the formula re-derived here, a full fine-tune, resume bit for bit, two processes, the plan and bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.config.presets import resolve_preset_path
from sanarl.core.lora import adapter_parameters
from sanarl.methods.config_loading import load_config
from sanarl.methods.mixgrpo.task import MixGRPOTask
from sanarl.training.data_order import step_generator
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch_cli  # noqa: E402

PRESET = resolve_preset_path("tiny-shapes-mixgrpo")
SHAPES = "sanarl.datasets.shapes"
SMALL = (
    "train.train_batch_per_replica=8",
    "train.train_policy.mini_batch=4",
    "validation.enable=false",
    "validation.val_before_train=false",
    "rollout.reward_workers=0",
)
FLASH = (
    "train.train_policy.mixgrpo.tail_solver=dpm2",
    "train.train_policy.mixgrpo.compress_ratio=0.4",
    "policy.diffusers.sample.sigma_grid=linspace",
    "train.train_policy.mixgrpo.interval=1",
    "train.train_policy.mixgrpo.stride=2",
    "train.train_policy.same_noise_per_group=false",
)
"""MixGRPO-Flash's tail on the tiny grid, the window moving by 2 steps every rollout: starts 0, 2, 4, 6, 8, 0 (each
sample from its own noise, so that late windows still see different rewards)."""


def loaded(out: Path, *extra: str, preset: Path = PRESET):
    return load_config(preset, [f"train.output_dir={out}", *SMALL, *extra])


def built(out: Path, *extra: str, preset: Path = PRESET) -> MixGRPOTask:
    """The task with its model, as `sanarl` builds it, without the runner."""
    return api.train(loaded(out, *extra, preset=preset), SHAPES, dry_run=True).task


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    """One short run of the shipped preset from the command line, the window moving every rollout."""
    tmp = tmp_path_factory.mktemp("mixgrpo-cli")
    out = tmp / "run"
    cmd = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-mixgrpo", SHAPES]
    for override in (
        f"train.output_dir={out}", "train.max_num_steps=3", "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=8", "train.train_policy.mixgrpo.interval=1", "validation.enable=false",
        "validation.val_before_train=false",
    ):  # fmt: skip
        cmd += ["--set", override]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def flash_task(tmp_path_factory) -> MixGRPOTask:
    return built(tmp_path_factory.mktemp("mixgrpo-flash") / "run", *FLASH)


def test_the_shipped_tiny_preset_runs_from_the_command_line_and_slides_its_window(cli_run):
    records = read_metrics(cli_run / "metrics.jsonl")
    trained = [r for r in records if "policy_loss" in r]
    assert [r["step"] for r in trained] == [1, 2, 3]
    assert [r["sde_window_start"] for r in trained] == [0.0, 1.0, 2.0]  # one step further every rollout
    assert [r["window_steps"] for r in trained] == [3.0, 3.0, 3.0]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in trained)
    assert all(r["ratio_first_dev"] < 1e-4 for r in trained)  # rollout and re-evaluation agree
    assert len({r["reward/mean"] for r in trained}) > 1
    assert (cli_run / "export" / "pytorch_lora_weights.safetensors").is_file()


def test_the_trained_steps_are_the_window_over_a_whole_schedule_with_the_dpm_tail(flash_task):
    task, sigmas = flash_task, flash_task.sigmas
    chunks = 8 // 4
    # the schedule has period 5; rollout 7 stands for 2 (whose 8 rewards happen to be equal: nothing to train)
    for step, (a, b) in zip(
        [0, 1, 7, 3, 4, 5], [(0, 3), (2, 5), (4, 7), (6, 8), (8, 8), (0, 3)], strict=True
    ):
        batches = task.micro_batches(step, step_generator(42, step, 0))
        assert task.last_metrics["sde_window_start"] == a and task.last_metrics["window_steps"] == b - a
        assert task.last_metrics["dropped_groups"] == 0
        assert task.last_trajectories[0].steps == list(range(a, b))
        trained = sorted({float(x["s"][0]) for x in batches})
        assert trained == sorted(float(sigmas[i]) for i in range(a, b))  # every window step, nothing else
        assert len(batches) == chunks * (b - a) and all(x["weight"] == 1.0 for x in batches)
        for x in batches:  # re-evaluated on the levels the rollout took (the DPM tail starts at s_b)
            i = [float(v) for v in sigmas].index(float(x["s"][0]))
            assert torch.equal(x["s_next"], sigmas[i + 1].expand(len(x["s"])))
        if batches:
            _, metrics = task.objective(batches[0], torch.Generator())
            assert abs(metrics["ratio_mean"] - 1) < 1e-5  # on-policy: the stored log-probs are re-derived


def _flow_sde_log_prob(x, v, x_next, s, s_next, eta, s_first_next):
    """Flow-GRPO's SDE step density (docs/algorithms.md, "Flow-GRPO SDE step"), per sample: the mean over elements
    of log N(x'; mu, (std sqrt(s - s'))^2) with std = eta sqrt(s / (1 - s)) (s_first_next in place of s at s = 1),
    mu = x (1 + std^2 dt / (2 s)) + v (1 + std^2 (1 - s) / (2 s)) dt."""
    s4, sn4 = s.view(-1, 1, 1, 1), s_next.view(-1, 1, 1, 1)
    dt = sn4 - s4
    std = eta * torch.sqrt(s4 / (1 - torch.where(s4 >= 1, torch.full_like(s4, s_first_next), s4)))
    mu = x * (1 + std**2 / (2 * s4) * dt) + v * (1 + std**2 * (1 - s4) / (2 * s4)) * dt
    sd = std * torch.sqrt(-dt)
    elem = -((x_next - mu) ** 2) / (2 * sd**2) - torch.log(sd) - 0.5 * math.log(2 * math.pi)
    return elem.flatten(1).mean(1)


def test_the_trained_loss_and_its_gradient_equal_the_ppo_clip_formula(flash_task):
    task = flash_task
    batches = task.micro_batches(6, step_generator(42, 6, 0))
    batch = batches[-1]  # the window (2, 5), its last step
    # MixGRPO's advantages: per group (R - mean) / (torch.std + 1e-8), one reward of weight 1, clipped to 5
    r = task.last_groups[0].reward.per_key["shapes"].double()
    want_adv = ((r - r.mean()) / (r.std() + 1e-8)).clamp(-5, 5).float()
    got_adv = torch.cat(
        [b["adv"] for b in batches if b["chunk"] >= 0 and float(b["s"][0]) == float(batch["s"][0])]
    )
    torch.testing.assert_close(got_adv, want_adv, rtol=1e-5, atol=1e-6)
    module = task.adapter.trainable_module()
    params = list(adapter_parameters(module, "default").values())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():  # move the policy off the rollout's, so that ratios differ from 1 and some clip
            g = torch.Generator().manual_seed(3)
            for p in params:
                p.add_(1e-2 * torch.randn(p.shape, generator=g))
        v = task.adapter.velocity(
            batch["x"], batch["s"], batch["cond"]
        )  # CFG-free: the policy is one forward
        logp = _flow_sde_log_prob(
            batch["x"], v, batch["x_next"], batch["s"], batch["s_next"], 0.7, float(task.sigmas[1])
        )
        ratio = torch.exp(logp - batch["old_log_prob"])
        adv = batch["adv"]
        dev = sorted((ratio.detach() - 1).abs().tolist())
        eps = (
            dev[1] + dev[2]
        ) / 2  # a clip range between the rows' deviations: both branches of the clip act
        task.view.train_policy.clip_range = eps
        loss, metrics = task.objective(batch, torch.Generator())
        got = torch.autograd.grad(loss, params)
        want = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps)).mean() * batch["weight"]
        assert metrics["loss"] == pytest.approx(want.item(), rel=1e-5, abs=1e-9)
        assert metrics["clip_frac"] == 0.5
        for a, b in zip(got, torch.autograd.grad(want, params), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-9)
        assert any(float(a.abs().max()) > 0 for a in got)
    finally:
        task.view.train_policy.clip_range = 1e-4
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)


def test_a_full_fine_tune_trains_the_transformer_on_the_window(tmp_path):
    text = PRESET.read_text()
    preset = tmp_path / "full.toml"
    preset.write_text(text[: text.index("[policy.lora]")] + text[text.index("[policy.diffusers]") :])
    task = built(tmp_path / "run", preset=preset)
    assert not task.uses_lora and task.reference is None  # kl_beta 0: no frozen copy
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    assert len(batches) == 2 * 3
    loss, _ = task.objective(batches[0], torch.Generator())
    loss.backward()
    grads = [p.grad for p in task.adapter.trainable_module().parameters() if p.requires_grad]
    assert grads and any(g is not None and float(g.abs().max()) > 0 for g in grads)


def test_resume_equals_uninterrupted_with_the_window_moving_every_rollout(tmp_path):
    extra = ("train.train_policy.mixgrpo.interval=1", "train.ckpt.save_freq=1")
    api.train(loaded(tmp_path / "a", *extra, "train.max_num_steps=1"), SHAPES)
    resumed = api.train(loaded(tmp_path / "a", *extra, "train.max_num_steps=2", "train.resume=true"), SHAPES)
    straight = api.train(loaded(tmp_path / "b", *extra, "train.max_num_steps=2"), SHAPES)
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert ra[-1]["sde_window_start"] == rb[-1]["sde_window_start"] == 1.0  # found again from the step alone
    assert ra[-1]["loss"] == rb[-1]["loss"]


@pytest.mark.xdist_group("accelerate")
def test_two_processes_run_one_training_with_the_same_window(tmp_path):
    run = tmp_path / "run"
    cli = ["--config", "tiny-shapes-mixgrpo", SHAPES]
    for override in (
        f"train.output_dir={run}", "train.max_num_steps=2", "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=8", "train.train_policy.mixgrpo.interval=1", "validation.enable=false",
        "validation.val_before_train=false", "train.ckpt.save_freq=2",
    ):  # fmt: skip
        cli += ["--set", override]
    launch = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    done = accelerate_launch_cli([*launch, "--dynamo_backend", "no"], cli, tmp_path, OMP_NUM_THREADS="1")
    assert "2 rank(s) = 1 prompts x 8 images" in " ".join(done.stdout.split()), done.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["sde_window_start"] for r in records] == [0.0, 1.0]
    assert all(math.isfinite(r["loss"]) for r in records)


def test_the_plan_prints_the_sliding_window_and_trains_its_steps():
    cfg = load_config(resolve_preset_path("flux1-mixgrpo-flash")).config
    rows = {k: " ".join(v.split()) for k, v in MixGRPOTask.describe(cfg, 1000, 8)}
    assert (
        "window of 4 of the 25 steps (its start moves by 1 every 20 rollouts, back to 0 past step 23)"
        in (rows["rollout"])
    )
    assert "DPM-Solver++(2M) after it on int((N + 1 - b) x 0.4) levels" in rows["rollout"]
    assert rows["trained steps"].startswith("4 per sample")
    assert (
        rows["micro-batches"]
        == "48 / mini_batch 4 = 12 per rank, x 4 trained steps = 48 backward passes (at most)"
    )


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["train.train_policy.mixgrpo.window_size=9"], ["mixgrpo.window_size", "num_steps = 10", "leaves 8 steps"]),
        (["train.train_policy.mixgrpo.compress_ratio=1.5"], ["mixgrpo.compress_ratio", "(0, 1]"]),
        (["train.train_policy.mixgrpo.compress_ratio=0.4"], ["compress_ratio", "tail_solver = 'dpm2'"]),
        (["train.train_policy.mixgrpo.compress_ratio=0.4", "train.train_policy.mixgrpo.tail_solver=dpm2"],
         ["compress_ratio", "sigma_grid = 'linspace'"]),
        (["train.train_policy.mixgrpo.interval=0"], ["mixgrpo.interval", ">= 1"]),
        (["train.train_policy.mixgrpo.stride=9"], ["mixgrpo.stride", "stride <= 8"]),
        (["train.train_policy.sde_window_size=2"], ["sde_window_size = 0", "mixgrpo.window_size"]),
        (["train.train_policy.ratio=guard"], ["train.train_policy.ratio = 'guard'", "ratio = 'plain'"]),
    ],
)  # fmt: skip
def test_bad_input_is_named(refused, overrides, needles):
    refused(PRESET, SHAPES, overrides, needles)


def test_a_window_that_stops_at_the_end_is_noted(run_cli):
    code, out, err = run_cli(
        "validate", "--config", str(PRESET), SHAPES, "--set", "train.train_policy.mixgrpo.roll_back=false"
    )
    text = " ".join((out + err).split())
    assert code == 0, err
    assert "from rollout 40 on the window starts at num_steps - 2 = 8 and is empty" in text, text
