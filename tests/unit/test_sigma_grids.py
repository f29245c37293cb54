"""The sampling grids of sanarl.core.flow against diffusers' schedulers, and which one each adapter picks
(docs/algorithms.md, "Conventions").

Oracle: a fresh diffusers scheduler's `set_timesteps(N)` (what a pipeline called without `sigmas` runs), and by
hand the formula shift(linspace(T_max, T_min, N)) with the table ends T = shift(1), shift(1/1000) for SD3.5.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

from sanarl.core.flow import dpm_flow_grid, flow_match_euler_grid, grid, sigma_grid
from sanarl.errors import ConfigError
from sanarl.models.base import DiffusionAdapter, scheduler_grid

CASES = [(n, k) for n in (1, 2, 6, 10, 20, 28, 40) for k in (1.0, 3.0, 4.5, 2.37)]


@pytest.mark.parametrize(("steps", "shift"), CASES)
def test_flow_match_euler_grid_is_set_timesteps_bit_for_bit(steps, shift):
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(steps)
    assert torch.equal(flow_match_euler_grid(steps, shift), sched.sigmas)


@pytest.mark.parametrize(("steps", "shift"), CASES)
def test_dpm_flow_grid_is_dpm_solvers_set_timesteps_bit_for_bit(steps, shift):
    sched = DPMSolverMultistepScheduler(
        use_flow_sigmas=True, flow_shift=shift, prediction_type="flow_prediction"
    )
    sched.set_timesteps(steps)
    assert torch.equal(dpm_flow_grid(steps, shift), sched.sigmas)


def test_sd35_grid_at_10_steps_by_hand():
    """shift 3: table ends 1 and 3 * 0.001 / 1.002; 10 levels between them, shifted again; the last nonzero level
    is 0.0089 where linspace(1, 1/N, N) shifted once gives 0.25."""

    def shift(u):
        return 3 * u / (1 + 2 * u)

    lo = shift(np.float32(0.001))
    expected = [shift(u) for u in np.linspace(1.0, float(lo), 10)] + [0.0]
    ours = flow_match_euler_grid(10, 3.0)
    torch.testing.assert_close(ours, torch.tensor(expected, dtype=torch.float32), atol=1e-7, rtol=0)
    assert ours[-2].item() == pytest.approx(0.00893, abs=1e-5)
    assert sigma_grid(10, 3.0)[-2].item() == pytest.approx(0.25)
    assert (sigma_grid(10, 3.0) - ours).abs().max().item() == pytest.approx(0.241, abs=1e-3)


def test_grid_by_name_and_unknown_names():
    torch.testing.assert_close(grid("linspace", 4, 3.0), sigma_grid(4, 3.0), atol=0, rtol=0)
    torch.testing.assert_close(
        grid("flow_match_euler", 4, 3.0), flow_match_euler_grid(4, 3.0), atol=0, rtol=0
    )
    with pytest.raises(ValueError, match="unknown sigma grid 'karras'"):
        grid("karras", 4, 3.0)


def test_scheduler_grid_names_the_schedulers_sanarl_reproduces():
    assert scheduler_grid(FlowMatchEulerDiscreteScheduler(shift=3.0)) == "flow_match_euler"
    dpm = DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0, prediction_type="flow_prediction")
    assert scheduler_grid(dpm) == "dpm_flow"
    # grids sanarl does not build: dynamic shifting (FLUX sets its own), Karras sigmas, DPM without flow sigmas
    assert scheduler_grid(FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)) is None
    assert scheduler_grid(FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True)) is None
    assert scheduler_grid(DPMSolverMultistepScheduler()) is None


def test_an_unreproduced_scheduler_needs_an_explicit_grid():
    adapter = SimpleNamespace(
        pipeline_grid=None, pipeline=SimpleNamespace(scheduler=DPMSolverMultistepScheduler())
    )
    with pytest.raises(
        ConfigError, match=r"DPMSolverMultistepScheduler.*policy\.diffusers\.sample\.sigma_grid"
    ):
        DiffusionAdapter.grid_name(adapter)
    assert DiffusionAdapter.grid_name(adapter, "linspace") == "linspace"
