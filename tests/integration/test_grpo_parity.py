"""Flow-GRPO parity on a one-block tiny SANA with real peft LoRA adapters: the training objective's value and its
LoRA gradient against the reference quantities re-derived here from their formulas (docs/algorithms.md,
"Flow-GRPO"), never by calling the objective's own helpers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.methods.config_loading import load_config
from sanarl.methods.flow_grpo.task import FlowGRPOTask
from sanarl.training.data_order import step_generator

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "grpo-tiny.toml"
SHAPES = "sanarl.datasets.shapes"


def one_block_task(out: Path, *extra: str) -> FlowGRPOTask:
    """The tiny Flow-GRPO task with its transformer cut to one block (LoRA on that block's attention)."""
    cfg = load_config(PRESET, [f"train.output_dir={out}", "rollout.reward_workers=0", *extra])
    task = api.train(cfg, SHAPES, dry_run=True).task
    module = task.adapter.trainable_module()
    module.transformer_blocks = module.transformer_blocks[:1]
    with torch.no_grad():  # LoRA B starts at 0: move it so the adapter changes v and the gradient is generic
        gen = torch.Generator().manual_seed(0)
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return task


def flow_sde_log_prob(x, x_next, v, s, s_next, s1, eta):
    """The Flow-GRPO SDE transition's log-density, mean over C, H, W, from its formula."""
    s, s_next = s.view(-1, 1, 1, 1), s_next.view(-1, 1, 1, 1)
    dt = s_next - s
    std = eta * torch.sqrt(s / (1 - torch.where(s >= 1, torch.full_like(s, s1), s)))
    mu = x * (1 + std**2 / (2 * s) * dt) + v * (1 + std**2 * (1 - s) / (2 * s)) * dt
    sigma = std * torch.sqrt(-dt)
    elem = -((x_next - mu) ** 2) / (2 * sigma**2) - torch.log(sigma) - 0.5 * math.log(2 * math.pi)
    return elem.flatten(1).mean(1)


def test_cfg_gradient_is_the_chain_through_both_branches(tmp_path):
    w = 4.5
    task = one_block_task(
        tmp_path, f"policy.diffusers.sample.guidance_scale={w}", "train.train_policy.kl_beta=0"
    )
    task.view.train_policy.clip_range = 1e9  # no clipping: the surrogate is -A ratio
    batch = task.micro_batches(0, step_generator(42, 0, 0))[0]
    params = [p for _, p in task.trainable_parameters()]
    loss, _ = task.objective(batch, torch.Generator())
    got = torch.autograd.grad(loss, params)

    # reference: L(v) from the formulas, dL/dv, then (dL/dv) (w dv_c/dtheta + (1 - w) dv_u/dtheta)
    x, x_next, s, s_next = batch["x"], batch["x_next"], batch["s"], batch["s_next"]
    adapter, uncond = task.adapter, task.rollouts.uncond
    v_c = adapter.velocity(x, s, batch["cond"])
    v_u = adapter.velocity(x, s, uncond.expand_to(len(x)))
    v = (v_u + w * (v_c - v_u)).detach().requires_grad_(True)
    logp = flow_sde_log_prob(x, x_next, v, s, s_next, float(task.sigmas[1]), task.spec.eta)
    ratio = torch.exp(logp - batch["old_log_prob"])
    ref_loss = (-batch["adv"] * ratio).mean() * batch["weight"]
    assert loss.item() == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-7)
    (g_v,) = torch.autograd.grad(ref_loss, v)
    d_c = torch.autograd.grad(v_c, params, w * g_v, retain_graph=True)
    d_u = torch.autograd.grad(v_u, params, (1 - w) * g_v)
    want = torch.cat([(a + b).flatten() for a, b in zip(d_c, d_u, strict=True)])
    got_flat = torch.cat([g.flatten() for g in got])
    assert want.abs().max() > 0
    cosine = torch.nn.functional.cosine_similarity(got_flat, want, dim=0)
    assert float(cosine) > 1 - 1e-5
    assert torch.allclose(got_flat, want, rtol=1e-3, atol=1e-5 * float(want.abs().max()))
    # the detached-uncond gradient (w dv_c only) is far from it: the test separates the two
    only_c = torch.cat([a.flatten() for a in d_c])
    assert float(torch.nn.functional.cosine_similarity(only_c, want, dim=0)) < 0.99


def test_every_sample_trains_steps_zero_to_int_n_frac_minus_one(tmp_path):
    task = one_block_task(tmp_path)  # 4 flow_sde steps, timesteps_fraction 0.5: steps 0 and 1
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    trained = sorted(
        {(float(s), float(n)) for b in batches for s, n in zip(b["s"], b["s_next"], strict=True)}
    )
    assert trained == sorted((float(task.sigmas[i]), float(task.sigmas[i + 1])) for i in (0, 1))
    assert all(len(set(b["s"].tolist())) == 1 for b in batches)  # one grid step per micro-batch


CPS_ALL_STEPS = (
    "policy.diffusers.sample.solver=cps",
    "policy.diffusers.timesteps_fraction=1.0",
    "train.train_policy.kl_beta=0",
)


def test_cps_trains_n_minus_one_steps_and_flow_grpos_n_with_cps_train_last_step(tmp_path):
    """flow_grpo with CPS and timesteps_fraction 1 trains all N steps: the last one (s' = 0, deterministic) has
    zero gradient on-policy but counts in the accumulation divisor. sanarl trains N - 1 by default and all N with
    `cps_train_last_step` (docs/algorithms.md, "Deliberate differences")."""
    default = one_block_task(tmp_path / "a", *CPS_ALL_STEPS)
    batches = default.micro_batches(0, step_generator(42, 0, 0))
    assert {float(n) for b in batches for n in b["s_next"]} == {float(v) for v in default.sigmas[1:-1]}
    task = one_block_task(tmp_path / "b", *CPS_ALL_STEPS, "train.train_policy.cps_train_last_step=true")
    every = task.micro_batches(0, step_generator(42, 0, 0))
    assert len(every) * 3 == len(batches) * 4  # N = 4 trained steps per sample instead of N - 1 = 3
    last = [b for b in every if float(b["s_next"][0]) == 0.0]
    assert len(last) == len(every) // 4
    params = [p for n, p in task.adapter.trainable_module().named_parameters() if "lora_" in n]
    for batch in last:
        loss, _ = task.objective(batch, step_generator(42, 0, 0))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        assert all(
            g is None or g.abs().max() == 0 for g in grads
        )  # on-policy: -(x' - mu)^2 is at its maximum
    first, _ = task.objective(every[0], step_generator(42, 0, 0))
    assert any(g.abs().max() > 0 for g in torch.autograd.grad(first, params) if g is not None)


def test_cps_train_last_step_needs_cps_and_no_kl(tmp_path):
    from sanarl.errors import ConfigError

    with pytest.raises(ConfigError, match="cps_train_last_step"):
        load_config(
            PRESET, [*CPS_ALL_STEPS[:2], "train.train_policy.cps_train_last_step=true"]
        )  # kl_beta 0.04
    with pytest.raises(ConfigError, match="solver = 'cps'"):
        load_config(PRESET, ["train.train_policy.cps_train_last_step=true", "train.train_policy.kl_beta=0"])
