"""AWM's config rules (sanarl/methods/awm/config.py) against what the method does: every number of trained levels a
time type allows on a grid draws that many distinct grid steps (sanarl/core/awm_loss.py), one more leaves a stratum
empty, and
the shipped presets carry the published method values (config/dgx_awm.py `geneval_sd3_no_cfg_1node`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sanarl.core.awm_loss import AWM_STEP_SCHEMES, awm_train_step_indices
from sanarl.methods.awm.config import trained_range
from sanarl.methods.config_loading import load_config

PRESETS = Path(__file__).resolve().parents[2] / "sanarl" / "presets"


@pytest.mark.parametrize("time_type", AWM_STEP_SCHEMES)
def test_the_level_limit_is_what_the_strata_hold_as_distinct_steps(time_type):
    for num_steps in range(1, 25):
        for fraction in (0.3, 0.5, 0.9, 1.0):
            _, top, most = trained_range(time_type, num_steps, fraction)
            if top == 0 and time_type != "discrete_with_init":
                assert most == 0
                continue
            for count in range(1, most + 1):  # every allowed T draws T distinct steps of the grid, every time
                for seed in range(3):
                    gen = torch.Generator().manual_seed(seed)
                    steps = awm_train_step_indices(
                        count, num_steps, fraction, scheme=time_type, generator=gen
                    )
                    assert (
                        len(set(steps.tolist())) == count
                        and 0 <= int(steps.min()) <= int(steps.max()) < num_steps
                    )
            # one more level than allowed gives a stratum of width 0 (the reference's linspace(low, m, n + 1)
            # boundaries truncated to integers), whose draw repeats its neighbour's step or lands on m itself
            count = most + 1 - (1 if time_type == "discrete_with_init" else 0)
            low = 0 if time_type == "discrete" else 1
            if count >= 1 and top >= low:
                bounds = torch.linspace(low, top, steps=count + 1).long()
                assert bool((bounds[1:] == bounds[:-1]).any()), (time_type, num_steps, fraction, most)


@pytest.mark.parametrize("preset", ["tiny-shapes-awm", "sd35m-awm", "sd35l-awm", "flux1-awm", "sana-image-awm",
                                    "sana-video-awm"])  # fmt: skip
def test_awm_presets_carry_the_published_method_values(preset):
    cfg = load_config(PRESETS / f"{preset}.toml").config
    tp, a = cfg.train.train_policy, cfg.train.train_policy.awm
    assert (a.weighting, a.ghuber_power, a.loss_type, a.time_type) == (
        "ghuber",
        0.25,
        "exp_first",
        "discrete_wo_init",
    )
    assert (a.advantage_max, a.kl_weight, a.ema_beta, a.kl_ema_weight) == (1.0, "uniform", 1.0, "uniform")
    assert (a.kl_ema_decay, a.kl_ema_decay_type) == (0.3, "linear")
    assert (tp.kl_beta, tp.clip_range, tp.advantage_high, tp.global_std) == (0.001, 1.0, 5.0, True)
    assert cfg.policy.diffusers.timesteps_fraction == 0.9 and "ema" in cfg.policy.lora.lora_names
    assert a.train_timesteps == (3 if preset.startswith("tiny") else 6)


def test_sd35m_awm_is_the_published_run():
    cfg = load_config(PRESETS / "sd35m-awm.toml").config
    sample, t = cfg.policy.diffusers.sample, cfg.train
    assert (sample.num_steps, sample.eval_num_steps, sample.guidance_scale) == (14, 40, 1.0)
    assert cfg.policy.diffusers.inference_size == [512, 512]
    assert (cfg.rollout.n_generation, t.train_batch_per_replica, t.train_policy.mini_batch) == (24, 1728, 3)
    assert (t.optm_lr, t.optm_weight_decay, t.optm_grad_norm_clip, t.ema_decay) == (3e-4, 1e-4, 1.0, 0.99)
    assert (cfg.policy.lora.r, cfg.policy.lora.lora_alpha) == (32, 64)
    assert t.train_policy.remote_reward.reward_fns[0].name == "geneval"


def test_awm_is_a_bench_method_compared_with_diffusion_nft():
    from sanarl.bench.methods import METHODS, RATIOS, rollout_cost
    from sanarl.bench.plan import resolve_plan

    plan = resolve_plan(False, "awm,nft", 1, 10.0)
    assert plan.methods == ("awm", "nft") and METHODS["awm"] == "tiny-shapes-awm"
    assert ("awm", "nft") in [(a, b) for a, b, _ in RATIOS]
    cfg = load_config(PRESETS / "tiny-shapes-awm.toml").config
    assert rollout_cost(cfg, 10) == (640, 640)  # 64 rollout samples per step, each scored once
    drafts = load_config(
        PRESETS / "tiny-shapes-awm.toml", ["rollout.family=naive_scaling", "rollout.num_candidates=16"]
    ).config
    assert rollout_cost(drafts, 10) == (10 * 8 * 16, 10 * 8 * 16)  # 16 drafts per prompt, each scored
