"""Agreement with the reference recipes that needs no model: the evaluation sampler, the Flow-GRPO presets' values,
the trained steps without a window, draft selection with unscorable drafts, chunk-invariant sample weights and
small recipe details (docs/algorithms.md)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sanarl.config import load_config as _load
from sanarl.tasks.sampling import GenerationSpec

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "presets"
ADAPTER = SimpleNamespace(default_shift=3.0)


def load_config(path: Path, overrides: list[str] = ()):
    return _load(path, overrides).config


@pytest.mark.parametrize("preset", ["tiny-shapes-grpo", "sd35m-grpo", "sana-image-grpo"])
def test_flow_grpo_evaluates_with_the_noise_free_ode(preset):
    cfg = load_config(PRESETS / f"{preset}.toml")
    sample, size = cfg.policy.diffusers.sample, cfg.policy.diffusers.inference_size
    rollout = GenerationSpec.from_sample_config(sample, ADAPTER, size, evaluation=False)
    evaluation = GenerationSpec.from_sample_config(sample, ADAPTER, size, evaluation=True)
    assert rollout.solver in ("flow_sde", "cps") and rollout.eta > 0  # rollouts keep the SDE
    assert (evaluation.solver, evaluation.eta) == ("euler", 0.0)
    assert evaluation.num_steps == sample.eval_num_steps


def test_eval_solver_chooses_the_ode_and_sd35m_nft_evaluates_with_euler():
    cfg = load_config(PRESETS / "sd35m-nft.toml")
    sample, size = cfg.policy.diffusers.sample, cfg.policy.diffusers.inference_size
    assert GenerationSpec.from_sample_config(sample, ADAPTER, size, evaluation=False).solver == "dpm2"
    assert GenerationSpec.from_sample_config(sample, ADAPTER, size, evaluation=True).solver == "euler"
    nft = load_config(PRESETS / "tiny-shapes-nft.toml")
    spec = GenerationSpec.from_sample_config(nft.policy.diffusers.sample, ADAPTER, size, evaluation=True)
    assert spec.solver == nft.policy.diffusers.sample.solver  # an ODE rollout solver is kept


def test_eval_solver_must_be_an_ode_solver():
    from sanarl.errors import ConfigError

    with pytest.raises(ConfigError, match="eval_solver"):
        load_config(PRESETS / "tiny-shapes-grpo.toml", ["policy.diffusers.sample.eval_solver=cps"])


@pytest.mark.parametrize("preset", ["sd35m-grpo", "sana-image-grpo"])
def test_sd35_style_flow_grpo_presets_take_two_optimizer_steps_per_rollout(preset):
    tp = load_config(PRESETS / f"{preset}.toml").train.train_policy
    assert (
        tp.optimizer_steps_per_rollout == 2
    )  # flow_grpo's SD3.5 configs: the second update is where the clip acts


def test_without_a_window_flow_grpo_trains_the_first_steps_of_the_grid():
    from sanarl.tasks.grpo import trained_positions

    every = list(range(10))
    assert trained_positions(every, 10, 0.5, windowed=False) == [0, 1, 2, 3, 4]  # steps 0 .. int(N frac) - 1
    assert trained_positions(every, 10, 0.99, windowed=False) == list(range(9))
    assert trained_positions(every, 10, 0.01, windowed=False) == [0]  # at least one
    assert trained_positions(every[:9], 10, 1.0, windowed=False) == list(range(9))  # cps: never the last step
    assert trained_positions([0, 1, 2], 10, 0.1, windowed=True) == [0, 1, 2]  # Fast: the whole window
