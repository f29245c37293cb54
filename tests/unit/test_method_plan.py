"""One plan per method: for every shipped preset the levels a sample trains are the same in the run (the task's
own step arithmetic), the printed plan (`Task.describe`, what `sanarl validate` prints) and the capacity plan
(`sanarl validate --gpus N --gpu NAME`, docs/capacity.md), and equal to the count re-derived here from the
reference rule (DiffusionNFT's and flow_grpo's `num_train_timesteps = int(num_steps * timestep_fraction)`; AWM's
`train_timesteps`)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from sanarl.config.presets import shipped_presets
from sanarl.core.flow import sigma_grid
from sanarl.methods.config_loading import load_config
from sanarl.methods.group_rl.rollout import PromptGroup
from sanarl.methods.registry import method_of
from sanarl.models.base import Cond
from sanarl.models.meta import architecture
from sanarl.tools.capacity.memory import trained_work

PRESETS = {p.stem: p for p in shipped_presets()}


def _expected_levels(cfg) -> int:
    """The levels the reference methods train, from the formula."""
    tp, sample, fraction = (
        cfg.train.train_policy,
        cfg.policy.diffusers.sample,
        cfg.policy.diffusers.timesteps_fraction,
    )
    kind = tp.trainer_type
    if kind in ("", "soar", "dpo"):
        return 1  # one noise level (SOAR: one trained forward over the main level and its auxiliary targets; DPO:
        # one per pair, as DiffusionDPO and Flow-Factory's num_train_timesteps = 1)
    if kind == "diffusion_nft":
        return max(1, int(sample.num_steps * fraction))
    if kind == "awm":
        return tp.awm.train_timesteps  # AWM's train.train_timesteps
    if kind == "ddrl" and tp.ddrl.train_on:
        return len(tp.ddrl.train_on)
    if kind == "mixgrpo":
        return tp.mixgrpo.window_size  # MixGRPO's window: its steps are the trained ones
    if tp.sde_window_size > 0:
        return tp.sde_window_size
    deterministic_last = sample.solver == "cps" and not tp.cps_train_last_step
    return min(max(1, int(sample.num_steps * fraction)), sample.num_steps - deterministic_last)


def _run_levels(cfg) -> int:
    """The levels the task trains per sample, from its own step arithmetic on the preset's grid (no model, no
    dataset): Flow-GRPO / DDRL pick the stored SDE steps of a rollout (`_trained_positions`); DiffusionNFT builds
    one micro-batch per (sample chunk, trained level) (`_training_batches`)."""
    method = method_of(cfg)
    cls = method.task_class()
    task = cls.__new__(cls)
    task.view, task.plan = cls.method_view(cfg), cls.method_plan(cfg)  # as GroupRLTask.__init__ sets them
    sample, tp = cfg.policy.diffusers.sample, cfg.train.train_policy
    grid, rng = sigma_grid(sample.num_steps, 3.0), torch.Generator().manual_seed(0)
    if tp.trainer_type == "dpo":  # online DPO: the micro-batches of one group's pair, a level per pair row
        task.rollouts = SimpleNamespace(spec=SimpleNamespace(shift=3.0))
        task.run = SimpleNamespace(mini_batch=cfg.rollout.n_generation)
        group = PromptGroup("p", {}, Cond(torch.zeros(1, 1, 1)), [0, 1], torch.zeros(2, 1, 2, 2), None, None)
        batches = task._pair_batches([group], [(0, 1)], torch.zeros(1), rng)
        return sum(len(b["s"]) for b in batches)
    if not method.sde_transitions:
        task.rollouts = SimpleNamespace(
            spec=SimpleNamespace(num_steps=sample.num_steps, sigmas=lambda _: grid)
        )
        task.run, task.adapter = SimpleNamespace(mini_batch=2), None
        group = PromptGroup("p", {}, Cond(torch.zeros(1, 1, 1)), [0, 1], torch.zeros(2, 1, 2, 2), None, None)
        batches = task._training_batches([group], torch.zeros(2), torch.ones(2, dtype=torch.bool), rng)
        if tp.trainer_type == "awm":  # one micro-batch per chunk, all its levels stacked
            return len(batches[0]["s"])
        return len(batches)  # one chunk of both samples
    task.sigmas = grid
    task.spec = SimpleNamespace(solver=sample.solver, num_steps=sample.num_steps)
    a = tp.sde_window_range[0] if tp.sde_window_size > 0 else 0
    steps = list(range(a, a + (tp.sde_window_size or sample.num_steps)))  # the stored steps of one rollout
    return len(task._trained_positions(steps, rng))


def _printed_levels(cfg) -> int | None:
    """The trained levels of the printed plan's micro-batches row (group RL; SFT and SOAR print none)."""
    rows = dict(method_of(cfg).task_class().describe(cfg, 1000, 1))
    found = re.search(r"x (\d+) trained (?:levels|steps)", rows["micro-batches"])
    return int(found.group(1)) if found else None


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_run_the_printed_plan_and_the_capacity_plan_train_the_same_levels(preset):
    cfg = load_config(PRESETS[preset]).config
    expected = _expected_levels(cfg)
    method = method_of(cfg)
    assert method.plan(cfg).levels == expected
    assert trained_work(cfg, architecture(cfg.policy.model_name_or_path)).levels == expected
    if method.group_rollouts:
        assert _run_levels(cfg) == expected
        assert _printed_levels(cfg) == expected
    else:  # SFT and SOAR draw one level per sample and print no count
        assert _printed_levels(cfg) is None


@pytest.mark.parametrize("preset", ["sana-image-grpo", "sd35m-grpo"])
def test_flow_grpo_presets_price_the_nine_steps_they_train(preset):
    """N = 10 at timesteps_fraction 0.99: flow_grpo trains int(9.9) = 9 steps, and so does the capacity plan."""
    cfg = load_config(PRESETS[preset]).config
    work = trained_work(cfg, architecture(cfg.policy.model_name_or_path))
    assert work.levels == 9
    assert work.forward_rows() == 9 * work.rows * 3 + work.frozen_rows
