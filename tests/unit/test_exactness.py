"""Agreement with the reference recipes that needs no model: the evaluation sampler, the Flow-GRPO presets' values,
the trained steps without a window, draft selection with unscorable drafts, chunk-invariant sample weights and
small recipe details (docs/algorithms.md)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sanarl.methods.config_loading import load_config as _load
from sanarl.training.sampling import GenerationSpec

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "sanarl" / "presets"
ADAPTER = SimpleNamespace(
    default_shift=3.0,
    shift_for=lambda height, width: 3.0,
    grid_name=lambda requested=None: requested or "flow_match_euler",
)


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


def test_eval_solver_is_an_ode_solver_or_flow_sde_with_its_own_noise_level():
    from sanarl.errors import ConfigError

    with pytest.raises(ConfigError, match="eval_solver"):
        load_config(PRESETS / "tiny-shapes-grpo.toml", ["policy.diffusers.sample.eval_solver=cps"])
    for sets in (
        ["policy.diffusers.sample.eval_solver=flow_sde"],
        ["policy.diffusers.sample.eval_noise_level=0.7"],
    ):
        with pytest.raises(ConfigError, match=r"eval_noise_level.*flow_sde"):
            load_config(PRESETS / "tiny-shapes-grpo.toml", sets)


@pytest.mark.parametrize("preset", ["sd35m-grpo", "sana-image-grpo"])
def test_sd35_style_flow_grpo_presets_take_two_optimizer_steps_per_rollout(preset):
    tp = load_config(PRESETS / f"{preset}.toml").train.train_policy
    assert (
        tp.optimizer_steps_per_rollout == 2
    )  # flow_grpo's SD3.5 configs: the second update is where the clip acts


GUARD_PRESETS = ["tiny-shapes-grpo-guard", "sd35m-grpo-guard", "sd35l-grpo-guard", "sana-image-grpo-guard",
                 "flux1-grpo-guard", "sana-video-grpo-guard"]  # fmt: skip


@pytest.mark.parametrize("preset", GUARD_PRESETS)
def test_grpo_guard_presets_carry_its_published_defaults_on_the_flow_sde_step(preset):
    cfg = load_config(PRESETS / f"{preset}.toml")
    tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
    # Flow-Factory's GRPOTrainingArguments: clip_range (-1e-4, 1e-4), adv_clip_range (-5, 5), kl_beta 0; Flow-SDE
    assert (tp.trainer_type, tp.ratio, tp.clip_range, tp.kl_beta) == ("flow_grpo", "guard", 1e-4, 0.0)
    assert (tp.advantage_low, tp.advantage_high) == (-5.0, 5.0)
    assert (sample.solver, sample.noise_level) == ("flow_sde", 0.7)


@pytest.mark.parametrize("preset", ["sd35m-grpo", "sana-image-grpo", "sd35m-ddrl", "sana-image-ddrl"])
def test_presets_with_flow_grpos_ema_update_it_after_every_sample_batch(preset):
    t = load_config(PRESETS / f"{preset}.toml").train
    assert (t.ema_enable, t.ema_decay, t.ema_update_step_interval, t.ema_update_per) == (
        True,
        0.9,
        8,
        "sample_batch",
    )


@pytest.mark.parametrize(
    "preset", ["tiny-shapes-ddrl", "sd35m-ddrl", "sana-image-ddrl", "flux1-ddrl", "sana-video-ddrl"]
)
def test_ddrl_presets_carry_cosmos_rls_weight_scale_normaliser_and_betas(preset):
    cfg = load_config(PRESETS / f"{preset}.toml")
    tp, t = cfg.train.train_policy, cfg.train
    assert (tp.ddrl.data_weighting, tp.ddrl.loss_scale, tp.ddrl.data_beta) == ("edm", 10.0, 0.01)
    assert (tp.global_std, tp.unbiased_std) == (False, True)  # per data item, torch.std
    assert tuple(t.optm_betas) == (0.9, 0.99) and t.optm_grad_norm_clip == 1.0


@pytest.mark.parametrize(
    ("num_steps", "fraction", "solver"),
    [
        (10, 0.5, "flow_sde"),
        (10, 0.99, "flow_sde"),
        (10, 0.01, "flow_sde"),
        (10, 1.0, "cps"),
        (6, 0.99, "cps"),
    ],
)
def test_without_a_window_flow_grpo_trains_the_first_steps_of_the_grid(num_steps, fraction, solver):
    """flow_grpo's train_sd3.py: num_train_timesteps = int(sample.num_steps * train.timestep_fraction), trained
    as the grid steps 0 .. num_train_timesteps - 1; sanarl keeps at least one and never CPS's deterministic
    last step (its std is 0)."""
    from sanarl.methods.flow_grpo.config import plan
    from sanarl.methods.flow_grpo.trajectory import trained_positions

    overrides = [f"policy.diffusers.sample.num_steps={num_steps}", f"policy.diffusers.sample.solver={solver}",
                 f"policy.diffusers.timesteps_fraction={fraction}", "train.train_policy.sde_window_size=0"]  # fmt: skip
    cfg = load_config(PRESETS / "tiny-shapes-grpo.toml", overrides)
    reference = max(1, min(int(num_steps * fraction), num_steps - (solver == "cps")))
    random_steps = list(range(num_steps - (solver == "cps")))  # trainable_positions over the whole grid
    assert plan(cfg).levels == reference
    assert trained_positions(random_steps, plan(cfg).levels) == list(range(reference))


def test_a_fast_window_trains_all_its_steps():
    from sanarl.methods.flow_grpo.config import plan
    from sanarl.methods.flow_grpo.trajectory import trained_positions

    cfg = load_config(PRESETS / "tiny-shapes-grpo.toml")  # sde_window_size = 3
    assert plan(cfg).levels == cfg.train.train_policy.sde_window_size == 3
    assert trained_positions([0, 1, 2], plan(cfg).levels) == [0, 1, 2]


@pytest.mark.parametrize(
    "mode", ["best_worst", "mean_deviation", "random", "extremes_random", "best_worst_random"]
)
def test_a_nan_draft_is_never_kept_while_a_scorable_one_remains(mode):
    import torch

    from sanarl.core.selection import select_scorable

    nan = float("nan")
    rewards = torch.tensor([0.3, nan, 0.9, 0.1, nan, 0.5, 0.7, 0.2])
    for seed in range(5):
        kept = select_scorable(rewards, 4, mode, generator=torch.Generator().manual_seed(seed)).tolist()
        assert len(set(kept)) == 4 and not any(i in (1, 4) for i in kept)
    if mode == "best_worst":  # top 2 and bottom 2 of the six scorable drafts
        assert select_scorable(rewards, 4, mode).tolist() == [2, 3, 6, 7]
    # fewer scorable drafts than slots: all of them, then NaN drafts fill the rest
    few = torch.tensor([nan, 0.4, nan, nan, 0.8])
    assert select_scorable(few, 3, mode, generator=torch.Generator().manual_seed(0)).tolist() == [0, 1, 4]


def test_nft_sample_weights_do_not_depend_on_the_chunking():
    """After NaN drops the last micro-batch is shorter: each row still weighs 1 / rows in the step's loss."""
    import torch

    from sanarl.methods.nft.task import NFTTask

    task = object.__new__(NFTTask)
    task.world = 1
    losses = torch.arange(7, dtype=torch.float64) ** 1.5  # 7 kept samples, one trained level
    for sizes in ([4, 3], [2, 2, 2, 1], [7]):
        bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
        batches = [
            {"adv": torch.zeros(b - a), "rows": losses[a:b]}
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        out = task._finish_chunk(batches)
        total = sum(b["weight"] * b["rows"].mean() for b in out) / len(out)  # the runner's accumulation
        assert float(total) == pytest.approx(float(losses.mean()), rel=1e-12)


def test_preview_kept_mean_is_over_kept_drafts_and_skips_nan():
    import torch

    from sanarl.methods.group_rl.rollout import PromptGroup, kept_mean
    from sanarl.rewards.combine import RewardResult

    def group(values):
        total = torch.tensor(values)
        return PromptGroup(
            "p", {}, None, [0] * len(values), None, None, RewardResult(total, {}, torch.isnan(total), {})
        )

    assert kept_mean([group([1.0, float("nan")]), group([2.0, 3.0])]) == pytest.approx(2.0)


def test_nft_rejects_an_advantage_low_it_cannot_honour():
    from sanarl.errors import ConfigError

    with pytest.raises(ConfigError, match="advantage_low = -1.0 has no effect for diffusion_nft"):
        load_config(PRESETS / "tiny-shapes-nft.toml", ["train.train_policy.advantage_low=-1.0"])
    load_config(
        PRESETS / "tiny-shapes-nft.toml", ["train.train_policy.advantage_low=-5.0"]
    )  # symmetric: fine


@pytest.mark.slow
def test_the_ema_warm_up_starts_at_the_references_first_decay(tmp_path, monkeypatch):
    """DiffusionNFT / flow_grpo pass their global step after counting the update: first decay 2/11, not 1/10."""
    from sanarl import api
    from sanarl.training.ema import EMA

    seen = []
    original = EMA.update
    monkeypatch.setattr(
        EMA, "update", lambda self, params, step: seen.append(step) or original(self, params, step)
    )
    preset = ROOT / "tests" / "data" / "presets" / "nft-tiny.toml"
    overrides = [f"train.output_dir={tmp_path}", "train.max_num_steps=2", "train.ema_enable=true"]
    overrides += [
        "rollout.reward_workers=0",
        "validation.enable=false",
        "train.ckpt.export_safetensors=false",
    ]
    api.train(_load(preset, overrides), "sanarl.datasets.shapes")
    assert seen == [1, 2]
    assert EMA([], decay=0.9).current_decay(seen[0]) == pytest.approx(2 / 11)


def test_several_updates_per_rollout_take_whole_sample_chunks():
    """flow_grpo / DiffusionNFT: an update covers whole sample batches with all their trained steps."""
    import torch

    from sanarl.methods.group_rl.task_base import split_updates

    batches = [{"chunk": c, "level": j} for c in range(5) for j in range(3)]  # 5 chunks x 3 trained levels
    parts = split_updates(batches, 2, torch.Generator().manual_seed(0))
    assert sorted(len(p) for p in parts) == [6, 9]  # 2 and 3 whole chunks
    for part in parts:
        chunks = {b["chunk"] for b in part}
        assert all(sorted(b["level"] for b in part if b["chunk"] == c) == [0, 1, 2] for c in chunks)
    assert sorted(b["chunk"] for p in parts for b in p) == sorted(b["chunk"] for b in batches)
    assert split_updates(batches, 1, torch.Generator()) == [batches]


def test_integer_timesteps_follow_diffusionnft_on_sd35_and_flow_grpo_refuses_them():
    """DiffusionNFT's and Sol-RL's SD3 samplers feed trunc(1000 s); flow_grpo the float (docs/algorithms.md)."""
    from sanarl.errors import ConfigError

    for preset in ("sd35m-nft", "sd35l-nft", "sd35l-nft-sol_rl", "sd35l-nft-naive_quant"):
        assert load_config(PRESETS / f"{preset}.toml").policy.diffusers.sample.integer_timesteps
    for preset in ("sd35m-grpo", "flux1-nft", "sana-image-nft", "tiny-shapes-nft"):
        assert not load_config(PRESETS / f"{preset}.toml").policy.diffusers.sample.integer_timesteps
    sample = load_config(PRESETS / "sd35m-nft.toml").policy.diffusers.sample
    assert GenerationSpec.from_sample_config(sample, ADAPTER, [512, 512], evaluation=True).integer_timesteps
    with pytest.raises(ConfigError, match="integer_timesteps = true"):
        load_config(PRESETS / "tiny-shapes-grpo.toml", ["policy.diffusers.sample.integer_timesteps=true"])


@pytest.mark.parametrize(
    "preset", ["sd35m-dpo", "sana-image-dpo", "sana-video-dpo", "sd35l-dpo", "flux1-dpo"]
)
def test_offline_dpo_presets_carry_diffusiondpos_launcher_values(preset):
    """DiffusionDPO's launchers/sdxl.sh and train.py defaults: beta_dpo 5000, 1 pair x 128 accumulation x 16 GPUs,
    lr 1e-8 scaled by that batch, 200 warm-up steps then constant, 2000 steps, AdamW (0.9, 0.999) with weight decay
    1e-2 and eps 1e-8, uniform timesteps, 20% empty captions."""
    cfg = load_config(PRESETS / f"{preset}.toml")
    tp, t, diff = cfg.train.train_policy, cfg.train, cfg.policy.diffusers
    assert (tp.type, tp.trainer_type, tp.dpo.beta_dpo, tp.mini_batch) == ("sft", "dpo", 5000.0, 1)
    assert (t.train_batch_per_replica, t.optm_lr, t.optm_warmup_steps, t.max_num_steps) == (
        2048,
        2.048e-5,
        200,
        2000,
    )
    assert (tuple(t.optm_betas), t.optm_weight_decay, t.epsilon, t.optm_grad_norm_clip) == (
        (0.9, 0.999),
        1e-2,
        1e-8,
        1.0,
    )
    assert (diff.weighting_scheme, diff.caption_dropout) == ("uniform", 0.2)


def test_the_online_dpo_preset_carries_flow_factorys_sd35_example():
    """Flow-Factory examples/dpo/lora/sd3_5/default.yaml: LoRA r 32 / alpha 64, beta 100, logit-normal (0, 1) levels,
    groups of 4, 48 prompts per epoch, 40 steps at guidance 1, lr 1e-5, weight decay 1e-4, EMA 0.99 every 4 steps."""
    cfg = load_config(PRESETS / "sd35m-dpo-online.toml")
    tp, t, diff, lora = cfg.train.train_policy, cfg.train, cfg.policy.diffusers, cfg.policy.lora
    assert (tp.type, tp.trainer_type, tp.dpo.beta_dpo, tp.global_std) == ("grpo", "dpo", 100.0, False)
    assert (lora.r, lora.lora_alpha, diff.weighting_scheme, diff.logit_mean, diff.logit_std) == (
        32,
        64,
        "logit_normal",
        0.0,
        1.0,
    )
    assert (cfg.rollout.n_generation, t.train_batch_per_replica // cfg.rollout.n_generation) == (4, 48)
    assert (diff.sample.num_steps, diff.sample.guidance_scale, diff.sample.solver) == (40, 1.0, "euler")
    assert (t.optm_lr, t.optm_weight_decay, t.ema_decay, t.ema_update_step_interval) == (1e-5, 1e-4, 0.99, 4)
