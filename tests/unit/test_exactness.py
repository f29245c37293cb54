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
