"""DDRL end to end on the tiny SANA (CPU, seconds; docs/algorithms.md, "DDRL"): the data term's inputs (the plugin's
images, the rollout's noise and levels, or base-model samples), its value against the model called here, `train_on`
with a random step, `data_on_first_only`, the exp reward, the moving KL reference, resume bit for bit, bad input and
the shipped preset through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.core.flow import interpolate, velocity_target
from sanarl.core.lora import adapter_parameters, adapters_disabled
from sanarl.core.samplers import initial_noise, sample_loop
from sanarl.datasets import shapes
from sanarl.methods.config_loading import load_config
from sanarl.methods.ddrl.task import DDRLTask
from sanarl.methods.group_rl.rollout import group_seeds
from sanarl.models.base import Cond
from sanarl.training.data_order import step_generator
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "ddrl-tiny.toml"
SHAPES = "sanarl.datasets.shapes"


def loaded(out: Path, *extra: str):
    return load_config(PRESET, [f"train.output_dir={out}", *extra])


def built(out: Path, *extra: str) -> DDRLTask:
    """The task with its model, as `sanarl` builds it, without the runner."""
    return api.train(loaded(out, "rollout.reward_workers=0", *extra), SHAPES, dry_run=True).task


def _data_loss_by_hand(task: DDRLTask, batch) -> float:
    """Cosmos-RL's data loss at the batch's levels s < 1 (`compute_loss_with_epsilon_and_sigma`, rectified-flow
    scaling, sigma_data 1): sigma = s / (1 - s), x_t = x0 + sigma eps, t = sigma / (1 + sigma), the network F at
    (1 - t) x_t and timestep t, x0_hat = (1 - t) x_t - t F, mean of (sigma^2 + 1) / sigma^2 (x0 - x0_hat)^2."""
    x0, eps, s = batch["data_x0"], batch["data_eps"], batch["data_s"]
    sigma = (s / (1 - s)).view(-1, 1, 1, 1)
    x_t = x0 + sigma * eps
    t = sigma / (1 + sigma)
    with torch.no_grad():
        F = task.adapter.velocity((1 - t) * x_t, t.flatten(), batch["cond"])
    x0_hat = (1 - t) * x_t - t * F
    return float(((sigma**2 + 1) / sigma**2 * (x0 - x0_hat) ** 2).mean())


def _plain_data_loss(task: DDRLTask, batch) -> float:
    x0, eps, s = batch["data_x0"], batch["data_eps"], batch["data_s"]
    with torch.no_grad():
        v = task.adapter.velocity(interpolate(x0, eps, s), s, batch["cond"])
    return float((v - velocity_target(x0, eps)).square().flatten(1).mean(1).mean())


def _row_of(initial: torch.Tensor, noise: torch.Tensor) -> int:
    """The rollout sample whose initial noise is `noise` (exactly one)."""
    rows = [i for i in range(len(initial)) if torch.equal(initial[i], noise)]
    assert len(rows) == 1
    return rows[0]


def test_the_data_term_reads_the_plugins_images_with_the_rollouts_noise_and_levels(tmp_path):
    task = built(tmp_path / "run")
    assert type(task) is DDRLTask
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    # the prompts are the captions of the step's SFT items, whose rendered images are the groups' data
    items = task._items
    assert isinstance(task.train_dataset, shapes.ShapesDataset) and task.train_dataset.image_size == 32
    assert all("image" in it for it in items)
    assert [g.prompt for g in task.last_groups] == [it["prompt"] for it in items]
    with torch.no_grad():
        want_x0 = task.adapter.encode_images(torch.stack([it["image"] for it in items])).float()
    k = task.view.rollout.n_generation
    initial = torch.cat([t.initial for t in task.last_trajectories])
    sigmas = task.sigmas
    positions_s = sorted({float(b["s"][0]) for b in batches})
    assert positions_s == sorted([float(sigmas[0]), float(sigmas[2])])  # train_on = [0, 2]
    for b in batches:
        rows = [_row_of(initial, e) for e in b["data_eps"]]
        torch.testing.assert_close(b["data_eps"], initial[rows])  # the sample's own initial noise
        torch.testing.assert_close(b["data_x0"], want_x0[[r // k for r in rows]], rtol=1e-5, atol=1e-5)
        assert torch.equal(b["data_s"], b["s"])  # the trained step's sigma
        assert b["data_on"]
    inner = next(b for b in batches if float(b["s"].max()) < 1)  # Cosmos-RL's x0 form needs sigma < inf
    loss, metrics = task.objective(inner, torch.Generator())
    loss.backward()
    assert metrics["data_loss"] == pytest.approx(_data_loss_by_hand(task, inner), rel=1e-5)
    # Cosmos-RL's loss_scale 10 multiplies the whole loss
    assert metrics["loss"] == pytest.approx(
        10 * (metrics["policy_loss"] + 0.5 * metrics["data_loss"]), rel=1e-5
    )
    grads = [p.grad for p in adapter_parameters(task.adapter.trainable_module(), "default").values()]
    assert any(g is not None and float(g.abs().max()) > 0 for g in grads)


def test_uniform_weighting_and_loss_scale_one_restore_the_plain_flow_matching_loss(tmp_path):
    task = built(
        tmp_path / "run",
        "train.train_policy.ddrl.data_weighting=uniform",
        "train.train_policy.ddrl.loss_scale=1",
    )
    batch = task.micro_batches(0, step_generator(42, 0, 0))[0]
    _, metrics = task.objective(batch, torch.Generator())
    assert metrics["data_loss"] == pytest.approx(_plain_data_loss(task, batch), rel=1e-5)
    assert metrics["loss"] == pytest.approx(metrics["policy_loss"] + 0.5 * metrics["data_loss"], rel=1e-5)


def test_the_ddrl_presets_normaliser_divides_each_group_by_its_unbiased_std_as_cosmos_rl(tmp_path):
    task = built(
        tmp_path / "run", "train.train_policy.global_std=false", "train.train_policy.unbiased_std=true"
    )
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    initial = torch.cat([t.initial for t in task.last_trajectories])
    k = task.view.rollout.n_generation
    want = []
    for (
        group
    ) in task.last_groups:  # Cosmos-RL: (r - mean) / (torch.std(r) + 1e-4) over a data item's rollouts
        r = [float(x) for x in group.reward.total]
        mean = sum(r) / k
        sd = (sum((x - mean) ** 2 for x in r) / (k - 1)) ** 0.5
        want += [min(max((x - mean) / (sd + 1e-4), -5.0), 5.0) for x in r]
    for b in batches:
        rows = [_row_of(initial, e) for e in b["data_eps"]]
        assert b["adv"].tolist() == pytest.approx([want[r] for r in rows], rel=1e-5)


def test_train_on_draws_its_random_step_per_rollout_and_data_on_first_only_keeps_one(tmp_path):
    task = built(
        tmp_path / "run",
        "train.train_policy.ddrl.train_on=[1, -1]",
        "train.train_policy.ddrl.data_on_first_only=true",
    )
    sigmas = [float(v) for v in task.sigmas]
    drawn = set()
    for step in range(6):
        batches = task.micro_batches(step, step_generator(42, step, 0))
        levels = sorted({sigmas.index(float(b["s"][0])) for b in batches})
        assert len(levels) == 2 and 1 in levels
        drawn |= set(levels) - {1}
        first = min(levels)
        assert all(b["data_on"] == (sigmas.index(float(b["s"][0])) == first) for b in batches)
    assert drawn == {0, 2, 3}  # the random step covers every other step over the rollouts


def test_use_rl_sigma_and_noise_false_draws_fresh_levels_and_noise_and_exp_reward_makes_advantages_negative(
    tmp_path,
):
    task = built(
        tmp_path / "run",
        "train.train_policy.ddrl.use_rl_sigma_and_noise=false",
        "train.train_policy.ddrl.exp_reward=true",
    )
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    initial = torch.cat([t.initial for t in task.last_trajectories])
    for b in batches:
        assert not torch.equal(b["data_s"], b["s"]) and bool(((b["data_s"] > 0) & (b["data_s"] < 1)).all())
        assert not any(torch.equal(e, i) for e in b["data_eps"] for i in initial)
        assert bool((b["adv"] < 0).all())  # -exp(-A) < 0, then clipped to [-5, 5]
        assert bool((b["adv"] >= -5).all())


def test_synthetic_data_are_base_model_samples_of_the_groups_prompts(tmp_path):
    task = built(tmp_path / "run", "train.train_policy.ddrl.data_source=synthetic")
    assert all("image" not in task.train_dataset[i] for i in range(2))  # the RL prompt set
    with torch.no_grad():  # make the policy differ from the base, so the source of the data shows
        next(iter(adapter_parameters(task.adapter.trainable_module(), "default").values())).add_(0.5)
    task.micro_batches(0, step_generator(42, 0, 0))

    module = task.adapter.trainable_module()
    shape = task.adapter.latent_shape(32, 32)
    seeds = [group_seeds(42, 0, 1, p, 1)[0] for p in range(len(task.last_groups))]
    x, _ = initial_noise(shape, seeds)
    cond = Cond.cat([g.cond for g in task.last_groups])
    with torch.no_grad(), adapters_disabled(module):
        want = sample_loop(
            lambda x_, s_: task.adapter.velocity(x_, s_, cond), x, task.sigmas, solver="euler"
        ).latents
    torch.testing.assert_close(task._data_x0, want.float(), rtol=1e-5, atol=1e-5)


def test_update_ref_every_iter_copies_the_policy_into_the_ref_adapter(tmp_path):
    task = built(
        tmp_path / "run",
        "train.train_policy.kl_beta=0.1",
        "train.train_policy.ddrl.update_ref_every_iter=2",
        'policy.lora.lora_names=["default", "ref"]',
    )
    module = task.adapter.trainable_module()
    default, ref = (adapter_parameters(module, n) for n in ("default", "ref"))

    def same() -> bool:
        return all(torch.equal(p, ref[k.replace(".default.", ".ref.")]) for k, p in default.items())

    with torch.no_grad():
        for p in default.values():
            p.add_(0.01)
    task.micro_batches(1, step_generator(42, 1, 0))  # 1 % 2 != 0: the reference stays
    assert not same()
    batch = task.micro_batches(2, step_generator(42, 2, 0))[0]  # copied before step 2
    assert same()
    _, metrics = task.objective(batch, torch.Generator())
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-12)  # the reference is the policy itself


def test_resume_equals_uninterrupted_with_data_term_random_steps_and_moving_reference(tmp_path):
    extra = (
        "train.train_batch_per_replica=4",
        "train.train_policy.ddrl.train_on=[0, -1]",
        "train.train_policy.kl_beta=0.1",
        "train.train_policy.ddrl.update_ref_every_iter=2",
        'policy.lora.lora_names=["default", "ref"]',
        "train.ckpt.save_freq=1",
    )
    api.train(loaded(tmp_path / "a", *extra, "train.max_num_steps=2"), SHAPES)
    resumed = api.train(loaded(tmp_path / "a", *extra, "train.max_num_steps=3", "train.resume=true"), SHAPES)
    straight = api.train(loaded(tmp_path / "b", *extra, "train.max_num_steps=3"), SHAPES)
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and any(".ref." in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert ra[-1]["loss"] == rb[-1]["loss"] and ra[-1]["data_loss"] > 0


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["train.train_policy.ddrl.train_on=[0, 4]"], ["train_on", "[0, 3]"]),
        (["train.train_policy.sde_window_size=2", "train.train_policy.sde_window_range=[0, 4]"],
         ["train_on", "sde_window_size = 0"]),
        (["train.train_policy.ddrl.update_ref_every_iter=2"], ["update_ref_every_iter", "kl_beta"]),
        (["train.train_policy.ddrl.update_ref_every_iter=2", "train.train_policy.kl_beta=0.1"],
         ["update_ref_every_iter", '"ref"', "lora_names"]),
        (["train.train_policy.ddrl.data_beta=-1"], ["ddrl.data_beta"]),
        (["train.train_policy.ddrl.data_source=images"], ["data_source", "synthetic"]),
    ],
)  # fmt: skip
def test_bad_input_is_named(refused, overrides, needles):
    refused(PRESET, SHAPES, overrides, needles)


def test_a_prompt_plugin_without_images_as_the_data_source_is_named_with_the_fix(run_cli, tmp_path):
    args = [
        "--config",
        str(PRESET),
        "sanarl.datasets.diffusion_nft",
        "--set",
        f"train.output_dir={tmp_path / 'run'}",
    ]
    args += ["--set", "train.train_policy.dataset.name=pickscore"]
    code, _, err = run_cli(*args)
    message = " ".join(err.split())
    assert code == 2, err
    assert "ddrl.data_source = 'dataset'" in message and "data_source = 'synthetic'" in message, message
    code, _, err = run_cli(*args, "--set", "train.train_policy.ddrl.data_source=synthetic", "--dry-run")
    assert code == 0, err


def test_the_shipped_tiny_preset_runs_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sanarl", "--config", "tiny-shapes-ddrl", SHAPES]
    for override in (
        f"train.output_dir={out}", "train.max_num_steps=2", "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=8", "validation.num_samples=8", "validation.freq=2",
    ):  # fmt: skip
        cmd += ["--set", override]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "data_loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["data_loss"] > 0 and r["reward/mean"] == r["reward/mean"] for r in trained)
    assert (out / "export" / "pytorch_lora_weights.safetensors").is_file()


def test_the_plan_counts_the_train_on_steps_and_names_the_data_term():
    from sanarl.config.presets import resolve_preset_path

    cfg = load_config(resolve_preset_path("sd35m-ddrl")).config
    rows = dict(DDRLTask.describe(cfg, 1000, 8))
    assert rows["trained steps"].startswith("10 per sample: train_on = [0, 2, 4")
    assert (
        rows["micro-batches"]
        == "32 / mini_batch 8 = 4 per rank, x 10 trained steps = 40 backward passes (at most)"
    )
    assert rows["loss"].startswith("10.0 x (PPO-clip")
    assert (
        "0.01 x (s^2 + (1 - s)^2) x flow matching on one base-model sample per prompt group" in rows["loss"]
    )
