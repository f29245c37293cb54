"""AWM end to end on the tiny SANA (CPU; docs/algorithms.md, "AWM"): the micro-batches (stratified levels of the
rollout grid, advantages clipped and scaled), the trained loss and its gradients against the formula re-derived here
from the tensors the task used, resume bit for bit, a full fine-tune, bad input, the plan line, the shipped tiny
preset from the command line and under a two-process launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.core.lora import adapter_parameters, adapters_disabled, using_adapter
from sanarl.methods.awm.task import AWMTask
from sanarl.methods.config_loading import load_config
from sanarl.models.base import Cond
from sanarl.training.data_order import step_generator
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "awm-tiny.toml"
SHAPES = "sanarl.datasets.shapes"
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch_cli  # noqa: E402

CLI_SETS = ("train.max_num_steps=2", "rollout.n_generation=4", "rollout.batch_size=8",
            "train.train_batch_per_replica=8", "train.train_policy.mini_batch=4", "validation.enable=false",
            "validation.val_before_train=false", "train.ckpt.save_freq=2")  # fmt: skip
"""The shipped tiny preset, cut to two steps of two prompt groups."""


def loaded(out: Path, *extra: str, preset: Path = PRESET):
    return load_config(preset, [f"train.output_dir={out}", *extra])


def built(out: Path, *extra: str) -> AWMTask:
    """The task with its model, as `sanarl` builds it, without the runner."""
    return api.train(loaded(out, *extra), SHAPES, dry_run=True).task


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sanarl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    """`sanarl --config tiny-shapes-awm sanarl.datasets.shapes`, as a user types it, for two short steps."""
    out = tmp_path_factory.mktemp("awm-cli") / "run"
    args = ["--config", "tiny-shapes-awm", SHAPES, "--set", f"train.output_dir={out}"]
    for override in CLI_SETS:
        args += ["--set", override]
    done = _cli(*args, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


# --- the formula, re-derived from docs/algorithms.md "AWM" (scxue/advantage_weighted_matching train_sd3_awm.py) --
def _surrogate(err: torch.Tensor, s: torch.Tensor, weighting: str, p: float) -> torch.Tensor:
    """compute_log_prob_awm's log p of a row from its mean squared flow-matching error (float64)."""
    if weighting == "ghuber":
        return -((err + 1e-10) ** p - 1e-10**p) * s / p
    if weighting == "huber":
        return -(torch.sqrt(err + 1e-10) - 1e-5) * s
    return -err * {"uniform": torch.ones_like(s), "t": s, "t2": s**2}[weighting]


def _kl(v: torch.Tensor, v_other: torch.Tensor, s: torch.Tensor, weight: str) -> torch.Tensor:
    sq = (v - v_other).square().flatten(1).mean(1)
    if weight == "elbo":
        std = torch.sqrt(s / (1 - s.clamp(0, 0.99))) * 0.7
        sq = sq / (2 * std**2)
    return sq.mean()


def _loss_by_hand(task: AWMTask, batch, old: torch.Tensor | None) -> torch.Tensor:
    """The reference's loss on the batch: T levels x B samples stacked level-major (torch.cat([x] * T)), x_s =
    (1 - s) x0 + s eps, the surrogate, the ratio (exp_first per row, sum_first per sample of the levels' mean),
    PPO-clip, beta x KL to the base (adapters off) and ema_beta x KL to the "ema" adapter, times the batch weight."""
    a, tp = task.view.awm, task.view.train_policy
    eps = batch["eps"]
    levels, size = eps.shape[:2]
    x0 = torch.cat([batch["x0"]] * levels)
    e = eps.reshape(levels * size, *eps.shape[2:])
    s = batch["s"].repeat_interleave(size)
    x_s = (1 - s.view(-1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1) * e
    cond = Cond.cat([batch["cond"]] * levels)
    module = task.adapter.trainable_module()
    v = task.adapter.velocity(x_s, s, cond)
    err = (v.double() - (e - x0).double()).square().flatten(1).mean(1)
    log_p = _surrogate(err, s.double(), a.weighting, a.ghuber_power).view(levels, size)
    old = log_p.detach() if old is None else old
    adv = batch["adv"].double()
    if a.loss_type == "sum_first":
        ratio = torch.exp(log_p.mean(0) - old.mean(0))
    else:
        ratio = torch.exp(log_p - old).flatten()
        adv = adv.repeat(levels)
    c = tp.clip_range
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - c, 1 + c)).mean()
    with torch.no_grad(), adapters_disabled(module):
        v_ref = task.adapter.velocity(x_s, s, cond)
    with torch.no_grad(), using_adapter(module, "ema"):
        v_ema = task.adapter.velocity(x_s, s, cond)
    loss = loss + tp.kl_beta * _kl(v, v_ref, s, a.kl_weight) + a.ema_beta * _kl(v, v_ema, s, a.kl_ema_weight)
    return loss * batch["weight"]


def _grads(task: AWMTask, loss: torch.Tensor) -> list[torch.Tensor]:
    params = list(adapter_parameters(task.adapter.trainable_module(), "default").values())
    return list(torch.autograd.grad(loss, params))


@pytest.mark.parametrize(
    ("extra", "off_policy"),
    [
        ((), False),
        (("train.train_policy.awm.weighting=t2", "train.train_policy.awm.loss_type=sum_first",
          "train.train_policy.awm.kl_weight=elbo", "train.train_policy.awm.kl_ema_weight=elbo",
          "train.train_policy.optimizer_steps_per_rollout=2"), True),
        (("train.train_policy.awm.weighting=huber", "train.train_policy.optimizer_steps_per_rollout=2"), True),
    ],
)  # fmt: skip
def test_the_trained_loss_and_its_gradients_are_the_formulas_on_the_tasks_tensors(
    tmp_path, extra, off_policy
):
    task = built(tmp_path / "run", *extra)
    module = task.adapter.trainable_module()
    with (
        torch.no_grad()
    ):  # the policy, its base and its EMA copy differ, so every term has a value and a gradient
        for k, p in adapter_parameters(module, "default").items():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(k))))
    batch = task.micro_batches(0, step_generator(42, 0, 0))[0]
    old = None
    if off_policy:  # a later update of the rollout: the rollout policy's log p, stored with the batch
        stored = batch["old_log_prob"]
        torch.testing.assert_close(stored, task._old_log_prob(batch), rtol=0, atol=0)
        old = stored.double()
        # ratio exp(-offset): samples 0 and 2 beyond the clip on the side that binds (PPO's pessimistic max picks
        # the clipped term), samples 1 and 3 beyond it on the side that does not
        sign = batch["adv"].sign().double()
        assert bool((sign != 0).all())
        old = old + torch.tensor([-0.5, 0.5, -0.5, 0.5]).double() * sign
        batch["old_log_prob"] = old
    loss, metrics = task.objective(batch, torch.Generator())
    want = _loss_by_hand(task, batch, old)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-6, abs=1e-12)
    assert metrics["kl_loss"] > 0 and metrics["ema_kl_loss"] > 0
    if off_policy and "sum_first" not in " ".join(extra):
        assert metrics["clip_frac"] == 1.0  # every ratio is exp(+-0.5), outside [0.8, 1.2]
    for got, ref in zip(_grads(task, loss), _grads(task, want), strict=True):
        torch.testing.assert_close(got, ref.to(got.dtype), rtol=1e-5, atol=1e-9)


def test_batches_train_stratified_grid_levels_with_clipped_and_scaled_advantages(tmp_path):
    task = built(tmp_path / "run")
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    grid = task.rollouts.spec.sigmas(task.adapter)
    # 4 steps x timesteps_fraction 1 -> m = 4; discrete_wo_init, T = 2: strata [1, 2) and [2, 4) of linspace(1, 4, 3)
    drawn = set()
    for b in batches:
        first, second = (int(i) for i in b["steps"])
        assert first == 1 and second in (2, 3)
        drawn.add(second)
        assert torch.equal(b["s"], grid[b["steps"]].float())
        assert b["eps"].shape == (2, *b["x0"].shape)
    # advantages: (r - mean of the prompt's group) / (std of all rewards + 1e-4), clipped to +-2, times 1 / 2
    rewards = torch.cat([g.reward.total for g in task.last_groups]).double()
    k = task.view.rollout.n_generation
    centred = rewards - rewards.view(-1, k).mean(1).repeat_interleave(k)
    want = (centred / (rewards.std(correction=0) + 1e-4)).clamp(-2, 2) / 2
    got = torch.cat([b["adv"] for b in batches]).double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert {b["chunk"] for b in batches} == {0, 1}


def test_resume_equals_uninterrupted_with_the_ema_copy(tmp_path):
    extra = ("train.ckpt.save_freq=1",)
    api.train(loaded(tmp_path / "a", *extra, "train.max_num_steps=1"), SHAPES)
    resumed = api.train(loaded(tmp_path / "a", *extra, "train.max_num_steps=2", "train.resume=true"), SHAPES)
    straight = api.train(loaded(tmp_path / "b", *extra, "train.max_num_steps=2"), SHAPES)
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and any(".ema." in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert ra[-1]["loss"] == rb[-1]["loss"] and ra[-1]["ema_kl_loss"] == rb[-1]["ema_kl_loss"] > 0
    assert [r["ema_decay"] for r in rb] == [0.001, 0.002]  # linear: min(0.3, 0.001 x optimizer steps done)


def test_a_full_fine_tune_trains_against_a_frozen_copy_of_the_base(tmp_path):
    text = PRESET.read_text()
    preset = tmp_path / "full.toml"
    preset.write_text(text[: text.index("[policy.lora]")] + text[text.index("[policy.diffusers]") :])
    cfg = loaded(
        tmp_path / "run", "train.train_policy.awm.ema_beta=0", "train.max_num_steps=2", preset=preset
    )
    result = api.train(cfg, SHAPES)
    task = result.task
    assert task.reference is not None and not any(p.requires_grad for p in task.reference.parameters())
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert records[0]["kl_loss"] == 0.0 and records[1]["kl_loss"] > 0  # the policy left the base after step 1
    moved = [not torch.equal(p, q) for p, q in zip(task.adapter.trainable_module().parameters(),
                                                   task.reference.parameters(), strict=True)]  # fmt: skip
    assert any(moved)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["train.train_policy.awm.train_timesteps=4"], ["train.train_policy.awm.train_timesteps", "at most 3"]),
        (["train.train_policy.awm.time_type=discrete_with_init", "train.train_policy.awm.train_timesteps=5"],
         ["train.train_policy.awm.train_timesteps", "'discrete_with_init'", "at most 4"]),
        (["train.train_policy.awm.weighting=ghubr"], ["train.train_policy.awm.weighting", "did you mean", "ghuber"]),
        (['policy.lora.lora_names=["default"]'], ["ema_beta", '"ema"', "lora_names"]),
        (["rollout.family=compile", "rollout.num_candidates=8"], ["rollout.family", "'diffusionnft'"]),
        (["train.train_policy.advantage_low=-1"], ["advantage_low", "advantage_high"]),
    ],
)  # fmt: skip
def test_bad_input_is_named(refused, overrides, needles):
    refused(PRESET, SHAPES, overrides, needles)


def test_the_plan_counts_the_stacked_levels_of_the_published_run():
    from sanarl.config.presets import resolve_preset_path

    cfg = load_config(resolve_preset_path("sd35m-awm")).config
    rows = dict(AWMTask.describe(cfg, 1000, 8))
    assert (
        rows["batch per step"]
        == "1728 / 24 (n_generation) / 8 rank(s) = 9 prompts x 24 images = 216 samples per rank"
    )
    assert rows["micro-batches"] == (
        "216 / mini_batch 3 = 72 per rank, x 6 trained levels (train_timesteps, discrete_wo_init strata of [1, "
        "int(14 x 0.9) = 12]) in one forward = 72 backward passes"
    )
    assert rows["loss"].startswith(
        "PPO-clip exp_first (clip_range 1.0) on the ghuber flow-matching log p + 0.001"
    )


def test_the_shipped_tiny_preset_trains_from_the_command_line(cli_run):
    records = [json.loads(line) for line in (cli_run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "policy_loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    first, second = trained
    # gaussian LoRA starts at the base; after one update the policy has left both the base and its EMA copy
    assert first["kl_loss"] == 0.0 and second["kl_loss"] > 0 and second["ema_kl_loss"] > 0
    assert (first["ema_decay"], second["ema_decay"]) == (0.001, 0.002)  # linear: min(0.3, 0.001 step)
    assert first["ratio_mean"] == 1.0 and first["reward/mean"] == first["reward/mean"]
    assert first["log_prob_mean"] != second["log_prob_mean"] and second["grad_norm"] > 0
    assert (cli_run / "export" / "pytorch_lora_weights.safetensors").is_file()


@pytest.mark.xdist_group("accelerate")
def test_two_processes_train_one_run(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 -m sanarl --config tiny-shapes-awm ...`: one run of world size
    2 (each rank one prompt group), each step logged once."""
    run = tmp_path / "run"
    cli = ["--config", "tiny-shapes-awm", SHAPES, "--set", f"train.output_dir={run}"]
    for override in CLI_SETS:
        cli += ["--set", override]
    launch = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no"]  # fmt: skip
    done = accelerate_launch_cli(launch, cli, tmp_path, OMP_NUM_THREADS="1")
    assert done.stdout.count("sanarl plan") == 1 and "2 rank(s) = 1 prompts x 4 images" in done.stdout, (
        done.stdout
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "policy_loss" in r] == [1, 2]
    assert (run / "export" / "pytorch_lora_weights.safetensors").is_file()
