"""Flow-GRPO end to end on the tiny SANA (CPU, seconds): the loop, the on-policy self-check, Fast windows with one
initial noise per group, zero-std group filtering, the full fine-tune reference, resume, and bad input."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.core.lora import adapter_parameters
from sanarl.core.samplers import initial_noise, sample_loop
from sanarl.methods.config_loading import load_config
from sanarl.methods.flow_grpo.task import FlowGRPOTask
from sanarl.methods.group_rl.task_base import GroupRLTask
from sanarl.training.data_order import step_generator
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "grpo-tiny.toml"
SHAPES = "sanarl.datasets.shapes"


def loaded(out: Path, *extra: str, preset: Path = PRESET):
    return load_config(preset, [f"train.output_dir={out}", *extra])


def built(out: Path, *extra: str, preset: Path = PRESET) -> FlowGRPOTask:
    """The task with its model, as `sanarl` builds it, without the runner (no optimizer step ever happens)."""
    return api.train(
        loaded(out, "rollout.reward_workers=0", *extra, preset=preset), SHAPES, dry_run=True
    ).task


def self_check_warnings(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "sanarl.methods.flow_grpo.task" and "self-check" in r.getMessage()
    ]


def test_tiny_run_trains_the_default_adapter_on_policy(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    outcome = api.train(loaded(tmp_path), SHAPES)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
        assert r["ratio_first_dev"] <= 1e-4  # one optimizer step per rollout: ratios are 1
        assert 1 - 1e-4 <= r["ratio_min"] <= r["ratio_max"] <= 1 + 1e-4
        assert r["clip_frac"] == 0 and r["dropped_groups"] == 0 and r["samples_trained"] == 8
    # LoRA B starts at zero: the policy is the base model at step 1, and has moved away from it by step 2
    assert records[0]["kl"] == 0 and records[1]["kl"] > 0
    module = outcome.task.adapter.trainable_module()
    assert set(adapter_parameters(module, "old")) == set()
    assert any(p.abs().sum() > 0 for k, p in adapter_parameters(module, "default").items() if "lora_B" in k)
    assert not self_check_warnings(caplog)
    assert (tmp_path / "export" / "pytorch_lora_weights.safetensors").is_file()
    assert (tmp_path / "rollouts" / "step_00000000.png").is_file()


def test_ratio_self_check_holds_and_warns_once_on_a_mismatch(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    task = built(tmp_path)
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    assert len(batches) == 2 * 2  # 8 samples / mini_batch 4, x int(4 x 0.5) trained steps
    for batch in batches[:2]:  # re-evaluated log-probs equal the rollout's: no step was taken
        task.objective(batch, torch.Generator())
    m = task.after_optimizer_step(1)
    assert m["ratio_first_dev"] <= 1e-4 and 1 - 1e-4 <= m["ratio_min"] <= m["ratio_max"] <= 1 + 1e-4
    assert not self_check_warnings(caplog)
    task._ratio.reset()  # a new step whose stored log-probs are off by 0.01 (e.g. a timestep mismatch)
    shifted = dict(batches[0], old_log_prob=batches[0]["old_log_prob"] + 0.01)
    _, metrics = task.objective(shifted, torch.Generator())
    task.objective(dict(batches[1], old_log_prob=batches[1]["old_log_prob"] + 0.01), torch.Generator())
    assert metrics["clip_frac"] == 1.0
    assert task.after_optimizer_step(1)["ratio_first_dev"] == pytest.approx(1 - math.exp(-0.01), abs=1e-4)
    assert len(self_check_warnings(caplog)) == 1  # once per step, for the first micro-batch only


@pytest.mark.parametrize("cfg_in_training", [True, False])
def test_cfg_rollouts_are_re_evaluated_with_the_same_guidance(tmp_path, caplog, cfg_in_training):
    caplog.set_level(logging.WARNING)
    flag = f"train.train_policy.cfg_in_training={str(cfg_in_training).lower()}"
    task = built(tmp_path, "policy.diffusers.sample.guidance_scale=4.5", flag)
    batch = task.micro_batches(0, step_generator(42, 0, 0))[0]
    loss, _ = task.objective(batch, torch.Generator())
    loss.backward()
    first_dev = task.after_optimizer_step(1)["ratio_first_dev"]
    if not cfg_in_training:  # training drops CFG: the self-check catches the mismatch
        assert first_dev > 1e-3 and len(self_check_warnings(caplog)) == 1
        return
    assert first_dev <= 1e-4 and not self_check_warnings(caplog)  # v_u + 4.5 (v_c - v_u), as at rollout
    # both branches carry gradient: conditioned on "" (v_c = v_u) the guided gradient w g + (1 - w) g is exactly
    # that of plain v_c (a detached uncond branch would give 4.5 g)
    task.view.train_policy.clip_range = 1e9  # no clipping, so the PPO term has a gradient
    on_empty = dict(batch, cond=task.rollouts.uncond.expand_to(len(batch["adv"])))
    grads = []
    for spec in (task.spec, replace(task.spec, guidance_scale=1.0)):
        task.spec = spec
        params = [p for _, p in task.trainable_parameters()]
        for p in params:
            p.grad = None
        task.objective(on_empty, torch.Generator())[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in params]))
    assert grads[1].abs().max() > 0
    assert (grads[0] - grads[1]).abs().max() <= 1e-4 * grads[1].abs().max()  # float noise of w = 4.5


def test_fast_window_with_one_noise_per_group(tmp_path):
    task = built(
        tmp_path,
        "train.train_policy.sde_window_size=2",
        "train.train_policy.sde_window_range=[1, 4]",
        "train.train_policy.same_noise_per_group=true",
    )
    batches = task.micro_batches(3, step_generator(42, 3, 0))
    a = task.last_trajectories[0].steps[0]
    sigmas = task.sigmas
    assert 1 <= a <= 2 and task.last_metrics["sde_window_start"] == a
    velocity = task.adapter.velocity
    for group, traj in zip(task.last_groups, task.last_trajectories, strict=True):
        assert traj.steps == [a, a + 1] and traj.states.shape[:2] == (4, 3) and traj.log_probs.shape == (4, 2)
        # before the window: the Euler ODE from the group's first seed's noise, the same for all 4 samples
        noise, _ = initial_noise(traj.states.shape[2:], group.seeds[:1])
        with torch.no_grad():
            ode = sample_loop(
                lambda x, s, c=group.cond: velocity(x, s, c), noise, sigmas, return_trajectory=True
            )
        assert torch.allclose(traj.states[:, 0], ode.trajectory[a].expand_as(traj.states[:, 0]), atol=1e-5)
        assert not torch.allclose(traj.states[0, 1], traj.states[1, 1])  # the SDE noise differs per sample
        # after the window: Euler again, from the window's last state to the stored final latents
        final = traj.states[:, -1]
        if a + 2 < len(sigmas) - 1:
            with torch.no_grad():
                final = sample_loop(
                    lambda x, s, c=group.cond: velocity(x, s, c), final, sigmas[a + 2 :]
                ).latents
        assert torch.allclose(final, group.latents.cpu(), atol=1e-5)
    pairs = {(float(s), float(n)) for b in batches for s, n in zip(b["s"], b["s_next"], strict=True)}
    assert pairs == {(float(sigmas[i]), float(sigmas[i + 1])) for i in (a, a + 1)}  # only window steps
    assert len(batches) == 2 * 2  # 2 chunks x every window step
    expected = torch.stack([sigmas[a + 1].expand(4), sigmas[a].expand(4)])
    for chunk in (batches[:2], batches[2:]):  # each sample trains each window step exactly once
        assert torch.equal(torch.stack([b["s"] for b in chunk]).sort(dim=0).values, expected)


def test_zero_std_groups_are_dropped_and_counted(tmp_path, monkeypatch):
    from sanarl.rewards.scorers import jpeg

    original, calls = jpeg.jpeg_kilobytes, []

    def first_group_constant(images, quality=95):
        calls.append(len(images))
        return torch.ones(len(images)) if len(calls) == 1 else original(images, quality)

    monkeypatch.setattr(jpeg, "jpeg_kilobytes", first_group_constant)
    task = built(tmp_path)
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    metrics = task.last_metrics
    assert metrics["dropped_groups"] == 1 and metrics["samples_trained"] == 4
    assert metrics["zero_std_ratio"] == 0.5
    assert len(batches) == 1 * 2  # only the second group's 4 samples, x 2 trained steps
    kept = task.last_trajectories[1].states
    for b in batches:
        assert b["weight"] == 1.0 and bool((b["adv"] != 0).all())
        for row in b["x"]:
            assert any(torch.equal(row, kept[k, j]) for k in range(4) for j in range(kept.shape[1]))


def test_full_fine_tune_keeps_a_frozen_reference(tmp_path):
    text = PRESET.read_text()
    no_lora = text[: text.index("[policy.lora]")] + text[text.index("[policy.diffusers]") :]
    preset = tmp_path / "full.toml"
    preset.write_text(no_lora)
    task = built(tmp_path / "run", preset=preset)
    assert task.reference is not None and not any(p.requires_grad for p in task.reference.parameters())
    frozen = {k: v.clone() for k, v in task.reference.state_dict().items()}
    batch = task.micro_batches(0, step_generator(42, 0, 0))[0]
    _, before = task.objective(batch, torch.Generator())
    assert before["kl"] <= 1e-12 and abs(before["ratio_mean"] - 1) <= 1e-4
    with torch.no_grad():
        next(p for p in task.adapter.trainable_module().parameters() if p.ndim == 2).add_(0.05)
    loss, after = task.objective(batch, torch.Generator())
    loss.backward()
    assert after["kl"] > 0
    assert all(torch.equal(v, frozen[k]) for k, v in task.reference.state_dict().items())


def test_resume_equals_uninterrupted(tmp_path):
    one_group = "train.train_batch_per_replica=4"
    api.train(loaded(tmp_path / "a", one_group, "train.max_num_steps=1", "train.ckpt.save_freq=1"), SHAPES)
    resumed = api.train(
        loaded(tmp_path / "a", one_group, "train.max_num_steps=2", "train.resume=true"), SHAPES
    )
    straight = api.train(loaded(tmp_path / "b", one_group, "train.max_num_steps=2"), SHAPES)
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and a
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["policy.diffusers.sample.solver=euler"], ["solver", "flow_sde"]),
        (["train.train_policy.sde_window_size=2", "train.train_policy.sde_window_range=[3, 6]"],
         ["sde_window_range", "num_steps = 4"]),
        (["rollout.family=naive_scaling", "rollout.num_candidates=8"], ["rollout.family", "diffusionnft"]),
        (["train.train_policy.clip_range=0"], ["clip_range"]),
    ],
)  # fmt: skip
def test_bad_input_is_named(refused, overrides, needles):
    refused(PRESET, SHAPES, overrides, needles)


def test_several_optimizer_steps_per_rollout_reuse_it_off_policy_where_the_clip_acts(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    steps = ["train.train_policy.optimizer_steps_per_rollout=2", "train.max_num_steps=4"]
    # each update takes whole sample chunks (as flow_grpo), so the second half was not in the first update:
    # lr 1e-3 moves the policy far enough for its ratios to leave the 1e-4 clip range
    api.train(loaded(tmp_path, *steps, "train.optm_lr=1e-3"), SHAPES)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    rollout_steps = [r["step"] for r in records if "reward/mean" in r]
    assert rollout_steps == [1, 3]  # rollouts at optimizer steps 0 and 2 (logged as 1 and 3)
    first, second = records[0], records[1]
    assert first["ratio_first_dev"] <= 1e-4 and first["clip_frac"] == 0  # on-policy half
    # the second half of the rollout runs after one update: ratios leave 1 and the PPO clip engages
    assert second["ratio_max"] - second["ratio_min"] > 1e-4
    assert second["clip_frac"] > 0
    assert not self_check_warnings(caplog)


def test_steps_per_rollout_must_fit_checkpoints(tmp_path):
    from sanarl.errors import ConfigError

    with pytest.raises(ConfigError, match="save_freq"):
        built(tmp_path, "train.train_policy.optimizer_steps_per_rollout=2", "train.ckpt.save_freq=3")


def _record_weights(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """The trained weights before the first update and after each optimizer step, as the runner makes them."""
    seen: list[dict[str, torch.Tensor]] = []

    def snapshot(task) -> None:
        seen.append({n: p.detach().float().clone() for n, p in task.trainable_parameters()})

    first_batches, after_step = FlowGRPOTask.micro_batches, FlowGRPOTask.after_optimizer_step

    def micro_batches(self, step, rng):
        if not seen:
            snapshot(self)
        return first_batches(self, step, rng)

    def after_optimizer_step(self, step):
        snapshot(self)
        return after_step(self, step)

    monkeypatch.setattr(FlowGRPOTask, "micro_batches", micro_batches)
    monkeypatch.setattr(FlowGRPOTask, "after_optimizer_step", after_optimizer_step)
    return seen


def test_the_ema_updates_after_every_sample_batch_as_flow_grpos_train_sd3(tmp_path, monkeypatch):
    """flow_grpo's `train_sd3.py` calls `ema.step(params, global_step)` after each of its sample batches; with k
    sample batches per optimizer step the first k - 1 see the global step before the update (and the weights of
    then), the last the step after it. EMAModuleWrapper.step pulls when (global_step + 1) % interval == 0 with
    decay min((1 + global_step) / (10 + global_step), ema_decay). Re-derived here from the weights of each step:
    2 chunks of mini_batch 4 per step (k = 2), interval 2, 3 steps."""
    from safetensors.torch import load_file

    weights = _record_weights(monkeypatch)
    out = tmp_path / "run"
    cfg = loaded(
        out, "train.max_num_steps=3", "train.ckpt.save_freq=3", "train.ema_enable=true", "train.ema_decay=0.9",
        "train.ema_update_step_interval=2", "train.ema_update_per=sample_batch", "validation.enable=false",
    )  # fmt: skip
    counted = []
    monkeypatch.setattr(FlowGRPOTask, "sample_batches", lambda self, micro: counted.append(
        GroupRLTask.sample_batches(self, micro)) or counted[-1])  # fmt: skip
    outcome = api.train(cfg, SHAPES)
    assert counted == [2, 2, 2]
    assert len(weights) == 4 and outcome.cfg.train.train_policy.mini_batch == 4
    k = 2  # train_batch_per_replica 8 / mini_batch 4 sample batches per optimizer step
    calls = []
    for step in range(3):  # optimizer step step + 1
        calls += [(step, weights[step])] * (k - 1) + [(step + 1, weights[step + 1])]
    shadow = {n: t.clone() for n, t in weights[0].items()}
    pulls = 0
    for gs, w in calls:
        if (gs + 1) % 2 == 0:
            decay = min((1 + gs) / (10 + gs), 0.9)
            for n in shadow:
                shadow[n] += (1 - decay) * (w[n] - shadow[n])
            pulls += 1
    assert pulls == 3  # global step 1 twice (once with no update between), global step 3 once
    saved = load_file(str(out / "checkpoints" / "step_00000003" / "ema.safetensors"))
    assert set(saved) == set(shadow)
    for n, want in shadow.items():
        torch.testing.assert_close(saved[n].float(), want, rtol=1e-6, atol=1e-8)
    # one update per optimizer step would have pulled at global steps 1 and 3 only
    once = {n: t.clone() for n, t in weights[0].items()}
    for gs in (1, 3):
        decay = min((1 + gs) / (10 + gs), 0.9)
        for n in once:
            once[n] += (1 - decay) * (weights[gs][n] - once[n])
    assert any(not torch.allclose(once[n], shadow[n], rtol=1e-4, atol=1e-7) for n in shadow)
