"""GRPO-Guard, Flow-GRPO's `train.train_policy.ratio = "guard"` option, end to end on the tiny SANA (CPU;
docs/algorithms.md, "GRPO-Guard"): the shipped preset from the command line (on- then off-policy), the trained loss
of one batch against the reference's formula re-derived here (values and gradients, full fine-tune), the paper's
mechanism on a run's own tensors (the plain log-ratio biased negative at the low-noise steps, the Guard one at 0),
resume bit for bit (LoRA), two processes, and the refused combinations."""

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
from sanarl.methods.config_loading import load_config
from sanarl.methods.flow_grpo.task import FlowGRPOTask
from sanarl.training.data_order import step_generator
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch_cli  # noqa: E402

PRESET = "tiny-shapes-grpo-guard"
SHAPES = "sanarl.datasets.shapes"
SMALL = ("rollout.n_generation=4", "rollout.batch_size=8", "train.train_batch_per_replica=8",
         "train.train_policy.mini_batch=8", "validation.enable=false", "validation.val_before_train=false",
         "train.ckpt.export_safetensors=false", "logging.multi_modal_log_interval=0")  # fmt: skip
EVERY_STEP = ("train.train_policy.sde_window_size=0", "policy.diffusers.timesteps_fraction=1.0")
"""Every one of the 10 grid steps stochastic and trained, so the low-noise steps are among them."""
HELD_OUT_ROLLOUT = 50
"""A rollout index the short training below never reaches: its samples are independent of the updates."""


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


# --- the shipped preset from the command line ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """Two optimizer steps of one rollout (`optimizer_steps_per_rollout = 2`): the first on-policy, the second
    off-policy; stdout and the metrics."""
    out = tmp_path_factory.mktemp("guard-cli") / "run"
    cmd = [sys.executable, "-m", "sanarl", "--config", PRESET, SHAPES]
    for override in (
        f"train.output_dir={out}", "train.max_num_steps=2", "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=8", "train.train_policy.optimizer_steps_per_rollout=2",
        "validation.num_samples=8", "validation.freq=2",
    ):  # fmt: skip
        cmd += ["--set", override]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out.parent, env=_env())
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done.stdout, read_metrics(out / "metrics.jsonl")


def test_the_shipped_tiny_preset_trains_from_the_command_line(cli_run):
    out, stdout, records = cli_run
    assert "GRPO-Guard" in stdout  # the plan's loss row
    trained = [r for r in records if "log_ratio_guard" in r]
    assert [r["step"] for r in trained] == [1, 2]
    first, second = trained
    assert first["ratio_first_dev"] < 1e-3 and first["log_ratio_guard"] == pytest.approx(0, abs=1e-6)
    assert all(r["grad_norm"] > 0 for r in trained) and math.isfinite(first["reward/mean"])  # one rollout
    # the second step re-reads the rollout after an update: the ratios move off 1
    assert second["log_ratio_plain"] != 0 and second["approx_kl"] > 0
    assert (second["ratio_min"], second["ratio_max"]) != (1.0, 1.0)
    assert (out / "export" / "pytorch_lora_weights.safetensors").is_file()


# --- a full fine-tune: the rollout policy, a briefly trained one, and a held-out rollout ----------------------------
@pytest.fixture(scope="module")
def off_policy(tmp_path_factory):
    """(task at the initial weights, task after 2 optimizer steps of a full fine-tune, the micro-batches of a
    rollout the initial weights sampled and the training never saw)."""
    root = tmp_path_factory.mktemp("guard-full")
    text = resolve_preset_path(PRESET).read_text()
    preset = root / "full.toml"
    preset.write_text(text[: text.index("[policy.lora]")] + text[text.index("[policy.diffusers]") :])
    # lr 1e-3 (the preset trains at 3e-4): two full fine-tune steps must move the policy far enough off the rollout's
    # for the plain ratio's bias to stand out of the noise at every level
    sets = [*SMALL, *EVERY_STEP, "rollout.reward_workers=0", "train.ema_enable=false", "train.optm_lr=1e-3"]
    initial = api.train(
        load_config(preset, [f"train.output_dir={root / 'a'}", *sets]), SHAPES, dry_run=True
    ).task
    batches = initial.micro_batches(HELD_OUT_ROLLOUT, step_generator(42, HELD_OUT_ROLLOUT, 0))
    loaded = load_config(preset, [f"train.output_dir={root / 'b'}", *sets, "train.max_num_steps=2"])
    trained = api.train(loaded, SHAPES).task
    assert not initial.uses_lora and not trained.uses_lora
    return initial, trained, batches


def _flow_sde(task: FlowGRPOTask, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Flow-SDE step of `task`'s policy at the batch, written out (arXiv 2505.05470 eq. 9): the mean, the
    transition std sigma [B, 1, 1, 1] and the per-element-mean Gaussian log-density of the stored x'."""
    x, x_next, cond = batch["x"], batch["x_next"], batch["cond"]
    s, s_next = batch["s"].view(-1, 1, 1, 1), batch["s_next"].view(-1, 1, 1, 1)
    v = task.adapter.velocity(x, batch["s"], cond).float()
    eta, s1 = task.spec.eta, float(task.sigmas[1])
    std = eta * torch.sqrt(s / (1 - torch.where(s >= 1, torch.full_like(s, s1), s)))
    dt = s_next - s
    mean = x * (1 + std**2 / (2 * s) * dt) + v * (1 + std**2 * (1 - s) / (2 * s)) * dt
    sigma = std * torch.sqrt(-dt)
    log_density = -((x_next - mean) ** 2) / (2 * sigma**2) - torch.log(sigma) - 0.5 * math.log(2 * math.pi)
    return mean, sigma, log_density.flatten(1).mean(1)


def test_the_rollout_stores_its_policys_step_means_and_log_probs(off_policy):
    initial, _, batches = off_policy
    with torch.no_grad():
        for batch in batches[:: len(batches) // 3]:
            mean, _, log_prob = _flow_sde(initial, batch)
            torch.testing.assert_close(batch["old_mean"], mean, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(batch["old_log_prob"], log_prob, rtol=1e-5, atol=1e-5)


def test_the_trained_loss_is_flow_factorys_grpo_guard_loss_with_its_gradients(off_policy):
    """Flow-Factory's GRPOGuardTrainer: ratio = exp((logp - logp_old) sigma + mean (mu - mu_old)^2 / (2 sigma)),
    L = mean max(-A r, -A clamp(r, 1 - eps, 1 + eps)), eps = clip_range; times the batch's loss weight."""
    _, task, batches = off_policy
    params = [p for p in task.adapter.trainable_module().parameters() if p.requires_grad]
    eps = task.view.train_policy.clip_range
    checked = 0
    for batch in batches[len(batches) // 2 :: 2]:  # the lower-noise steps, where the ratios move most
        task.adapter.trainable_module().zero_grad(set_to_none=True)
        loss, metrics = task.objective(batch, torch.Generator())
        loss.backward()
        got = [p.grad.clone() for p in params]
        mean, sigma, log_prob = _flow_sde(task, batch)
        sigma = sigma.flatten()
        mse = (mean - batch["old_mean"]).flatten(1).pow(2).mean(1)
        ratio = torch.exp((log_prob - batch["old_log_prob"]) * sigma + mse / (2 * sigma))
        adv = batch["adv"].clamp(-5.0, 5.0)
        want = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps)).mean() * batch["weight"]
        grads = torch.autograd.grad(want, params)
        assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-12)
        assert metrics["ratio_mean"] == pytest.approx(ratio.mean().item(), rel=1e-6)
        for g, w in zip(got, grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-10)
        checked += int(float(torch.cat([w.flatten() for w in grads]).abs().max()) > 0)
    assert checked > 0  # at least one batch had unclipped rows, so gradients were compared


def test_the_guard_ratio_is_centred_where_the_plain_one_is_biased_negative(off_policy):
    """GRPO-Guard's claim, on a run's tensors: after training, the plain log-ratio of a held-out rollout's steps
    has mean ~ -mean (dmu^2) / (2 sigma^2) (negative, growing as sigma shrinks), the normalised one ~ 0 at every
    step (the task's logged `log_ratio_plain`, `log_ratio_guard`)."""
    _, task, batches = off_policy
    by_level: dict[float, list[tuple[float, float]]] = {}
    with torch.no_grad():
        for batch in batches:
            _, m = task.objective(batch, torch.Generator())
            by_level.setdefault(float(batch["s"][0]), []).append((m["log_ratio_plain"], m["log_ratio_guard"]))
    levels = sorted(by_level, reverse=True)  # high noise first
    plain = [sum(p for p, _ in by_level[s]) / len(by_level[s]) for s in levels]
    guard = [sum(g for _, g in by_level[s]) / len(by_level[s]) for s in levels]
    assert len(levels) == 10
    assert (
        plain[-1] < -0.05 and plain[-1] < 10 * plain[0] < 0
    )  # an order of magnitude more biased at low noise
    assert all(p < 0 for p in plain[len(plain) // 2 :])
    assert max(abs(g) for g in guard) < 0.01 * abs(plain[-1])
    assert abs(sum(guard) / len(guard)) < 0.01 * abs(sum(plain) / len(plain))


# --- resume (LoRA), two processes, the plan, bad input ---------------------------------------------------------
def test_resume_equals_uninterrupted(tmp_path):
    def run(out: Path, *extra: str):
        sets = [f"train.output_dir={out}", *SMALL, "rollout.reward_workers=0", *extra]
        return api.train(load_config(resolve_preset_path(PRESET), sets), SHAPES)

    run(tmp_path / "a", "train.max_num_steps=1", "train.ckpt.save_freq=1")
    resumed = run(tmp_path / "a", "train.max_num_steps=2", "train.resume=true")
    straight = run(tmp_path / "b", "train.max_num_steps=2")
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and a and resumed.task.uses_lora
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert ra[-1]["loss"] == rb[-1]["loss"] and ra[-1]["log_ratio_guard"] == rb[-1]["log_ratio_guard"]


@pytest.mark.xdist_group("accelerate")  # accelerate launches share port 29500
def test_two_processes_train_one_run(tmp_path):
    run = tmp_path / "run"
    cli = ["--config", PRESET, SHAPES]
    for override in (
        *SMALL,
        f"train.output_dir={run}",
        "train.max_num_steps=1",
        "train.train_batch_per_replica=16",
    ):
        cli += ["--set", override]
    launch = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    done = accelerate_launch_cli([*launch, "--dynamo_backend", "no"], cli, tmp_path, OMP_NUM_THREADS="1")
    assert done.stdout.count("sanarl plan") == 1 and "2 rank(s)" in done.stdout, done.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    assert records[0]["samples_trained"] > 0 and records[0]["grad_norm"] > 0


def test_the_plan_names_the_guard_ratio():
    cfg = load_config(resolve_preset_path("sd35m-grpo-guard")).config
    rows = dict(FlowGRPOTask.describe(cfg, 1000, 8))
    assert rows["loss"] == (
        "GRPO-Guard's normalised ratio, PPO-clip (clip_range 0.0001) + 0.0 x KL to the base model (LoRA disabled)"
    )


@pytest.mark.parametrize(
    ("preset", "overrides", "needles"),
    [
        (PRESET, ["policy.diffusers.sample.solver=cps"],
         ["train.train_policy.ratio = 'guard'", "policy.diffusers.sample.solver = 'cps'", "solver = 'flow_sde'"]),
        ("tiny-shapes-ddrl", ["train.train_policy.ratio=guard", "policy.diffusers.sample.solver=flow_sde"],
         ["train.train_policy.ratio = 'guard'", "trainer_type = 'ddrl'", "ratio = 'plain'"]),
        (PRESET, ["train.train_policy.ratio=normalised"], ["train.train_policy.ratio", "guard"]),
    ],
)  # fmt: skip
def test_bad_input_is_named(refused, preset, overrides, needles):
    refused(resolve_preset_path(preset), SHAPES, overrides, needles)
