"""DiffusionNFT end to end on the tiny SANA (CPU, seconds): the loop, the old-adapter rule, Sol-RL's two-stage
rollout, resume (also with the int8-quantized rollout copies), and bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sanarl import api
from sanarl.core.lora import adapter_parameters
from sanarl.methods.config_loading import load_config
from sanarl.methods.group_rl.quantize import Int8DynamicLinear
from sanarl.methods.group_rl.rollout import group_seeds
from sanarl.training.ema import old_weight_decay
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "nft-tiny.toml"
SHAPES = "sanarl.datasets.shapes"
sys.path.insert(0, str(ROOT / "tests" / "data"))
from rollout_families import INT8, record_compiles  # noqa: E402


def loaded(out: Path, *extra: str):
    return load_config(PRESET, [f"train.output_dir={out}", *extra])


def test_nft_steps_train_the_default_adapter_and_decay_the_old_one(tmp_path, monkeypatch):
    from sanarl.methods.nft import task as nft

    snapshots = []
    original = nft.NFTTask.after_optimizer_step

    def spy(self, step):
        module = self.adapter.trainable_module()
        before = {k: v.detach().clone() for k, v in adapter_parameters(module, "old").items()}
        out = original(self, step)
        after = adapter_parameters(module, "old")
        new = {k: v.detach().clone() for k, v in adapter_parameters(module, "default").items()}
        snapshots.append((step, before, {k: v.detach().clone() for k, v in after.items()}, new))
        return out

    monkeypatch.setattr(nft.NFTTask, "after_optimizer_step", spy)
    outcome = api.train(loaded(tmp_path, "train.max_num_steps=3"), SHAPES)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    assert all(r["reward/std"] > 0 for r in records)  # jpeg sizes differ: there is signal
    assert any(r["grad_norm"] > 0 for r in records)
    for step, before, after, new in snapshots:
        d = old_weight_decay(step, 1)
        for key, value in after.items():
            expected = d * before[key] + (1 - d) * new[key.replace(".old.", ".default.")]
            assert torch.allclose(value, expected, atol=1e-7), key
    assert (tmp_path / "export" / "pytorch_lora_weights.safetensors").is_file()
    assert (tmp_path / "rollouts" / "step_00000000.png").is_file()
    assert outcome.result.steps == 3


def test_two_optimizer_steps_per_rollout_move_the_old_adapter_once_per_rollout(tmp_path, monkeypatch):
    from sanarl.methods.nft import task as nft

    rollouts, moves = [], []
    original_rollout, original_after = nft.NFTTask._rollout_batches, nft.NFTTask.after_optimizer_step

    def spy_rollout(self, step, rng):
        rollouts.append(step)
        return original_rollout(self, step, rng)

    def spy_after(self, step):
        module = self.adapter.trainable_module()
        before = {k: v.detach().clone() for k, v in adapter_parameters(module, "old").items()}
        out = original_after(self, step)
        after = adapter_parameters(module, "old")
        moves.append((step, any(not torch.equal(before[k], after[k]) for k in before), out))
        return out

    monkeypatch.setattr(nft.NFTTask, "_rollout_batches", spy_rollout)
    monkeypatch.setattr(nft.NFTTask, "after_optimizer_step", spy_after)
    api.train(
        loaded(tmp_path, "train.max_num_steps=4", "train.train_policy.optimizer_steps_per_rollout=2"), SHAPES
    )
    assert rollouts == [0, 1]  # optimizer steps 0-1 share rollout 0, steps 2-3 rollout 1
    assert [(s, moved) for s, moved, _ in moves] == [(1, False), (2, True), (3, False), (4, True)]
    # the decay counts optimizer steps, as DiffusionNFT's global_step (not rollouts)
    assert moves[1][2]["old_decay"] == old_weight_decay(2, 1)
    assert moves[3][2]["old_decay"] == old_weight_decay(4, 1)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "reward/mean" in r] == [1, 3]
    assert all(r["grad_norm"] > 0 for r in records)  # every optimizer step trains on its half


def test_sol_rl_regenerates_exactly_the_kept_seeds(tmp_path):
    """A kept draft regenerated at the preview's step count equals the draft (explicit per-sample seeds)."""
    cfg = loaded(
        tmp_path,
        "rollout.family=sol_rl",
        "rollout.num_candidates=8",
        "rollout.preview_step=6",
        "rollout.preview_precision=bf16",
        "rollout.reward_workers=0",
    )
    outcome = api.train(cfg, SHAPES, dry_run=True)
    rollouts = outcome.task.rollouts
    seeds = group_seeds(0, 0, 0, 0, 8)
    groups, metrics = rollouts.rollout(["a red circle"], [outcome.task.train_dataset[0]["metadata"]], [seeds])
    kept = groups[0]
    assert len(kept.seeds) == 4 and set(kept.seeds) <= set(seeds)
    drafts = rollouts._sample(kept.cond, seeds, rollouts.preview_spec, rollouts.preview_copy)
    for i, seed in enumerate(kept.seeds):
        assert torch.allclose(kept.latents[i], drafts[seeds.index(seed)], atol=1e-5)
    assert metrics["rollout_images"] == 8 + 4


def test_best_worst_keeps_the_extremes_of_the_drafts(tmp_path):
    cfg = loaded(
        tmp_path, "rollout.family=naive_scaling", "rollout.num_candidates=8", "rollout.reward_workers=0"
    )
    outcome = api.train(cfg, SHAPES, dry_run=True)
    rollouts = outcome.task.rollouts
    seeds = group_seeds(0, 0, 0, 0, 8)
    cond = rollouts.adapter.encode_prompts(["a red circle"])
    images = rollouts.adapter.decode(rollouts._sample(cond, seeds, rollouts.spec, None))
    scores = rollouts.reward_fn(images, ["a red circle"] * 8, [{}] * 8).total
    groups, _ = rollouts.rollout(["a red circle"], [{}], [seeds])
    ranked = [seeds[i] for i in torch.argsort(scores, descending=True).tolist()]
    assert set(groups[0].seeds) == set(ranked[:2] + ranked[-2:])


def test_resume_equals_uninterrupted(tmp_path):
    api.train(loaded(tmp_path / "a", "train.max_num_steps=2", "train.ckpt.save_freq=2"), SHAPES)
    resumed = api.train(loaded(tmp_path / "a", "train.max_num_steps=4", "train.resume=true"), SHAPES)
    straight = api.train(loaded(tmp_path / "b", "train.max_num_steps=4"), SHAPES)
    a = resumed.task.state_tensors()
    b = straight.task.state_tensors()
    assert set(a) == set(b) and any(".old." in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("rollout.n_generation=3", "n_generation"),
        ("train.train_policy.kl_beta=-1", "kl_beta"),
        ("train.train_policy.remote_reward.reward_fns.0.name=pickscor", "pickscor"),
        ("train.train_policy.remote_reward.reward_fns.0.score_key=nope", "nope"),
        ("rollout.family=sol_rl", "transformer-engine"),
    ],
)
def test_bad_input_is_named(refused, override, needle):
    extra = ["rollout.num_candidates=8"] if "sol_rl" in override else []
    refused(PRESET, SHAPES, [override, *extra], [needle])


def test_empty_prompt_file(run_cli, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n\n")
    code, _, err = run_cli(
        "--config", str(PRESET), "sanarl.datasets.diffusion_nft",
        "--set", f"train.train_policy.dataset.local_dir={prompts}", "--set", f"train.output_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert code == 2 and str(prompts) in " ".join(err.split())


def test_nan_rewards_are_dropped_and_counted(tmp_path, monkeypatch):
    from sanarl.rewards.scorers import jpeg

    original = jpeg.jpeg_kilobytes

    def some_nan(images, quality=95):
        kb = original(images, quality)
        kb[0] = float("nan")
        return kb

    monkeypatch.setattr(jpeg, "jpeg_kilobytes", some_nan)
    api.train(loaded(tmp_path, "train.max_num_steps=1", "rollout.reward_workers=0"), SHAPES)
    record = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert record["reward/dropped"] == 2  # the first image of each of the 2 prompt groups
    assert torch.isfinite(torch.tensor(record["loss"]))


def test_ranks_with_fewer_micro_batches_pad_with_zero_weight_batches(tmp_path, monkeypatch):
    """NaN rewards drop samples per rank: the short rank pads to the longest rank's count with batches that
    contribute no loss and no gradient."""
    import accelerate.utils

    task = api.train(loaded(tmp_path, "rollout.reward_workers=0"), SHAPES, dry_run=True).task
    batches = task._rollout_batches(0, torch.Generator().manual_seed(0))
    task.world = 2
    monkeypatch.setattr(accelerate.utils, "gather", lambda t: torch.tensor([len(batches), len(batches) + 3]))
    padded = task._finish_chunk(batches)
    assert len(padded) == len(batches) + 3 and padded[: len(batches)] == batches
    module = task.adapter.trainable_module()
    loss, _ = task.objective(padded[-1], torch.Generator().manual_seed(1))
    loss.backward()
    assert loss.item() == 0.0
    grads = [p.grad for p in module.parameters() if p.requires_grad and p.grad is not None]
    assert all(float(g.abs().sum()) == 0.0 for g in grads)


def test_held_out_rewards_and_wall_budget(tmp_path):
    """validation.held_out_rewards are scored on the validation samples and logged as heldout/<reward>/<key>
    (the reward-hacking guard); train.max_wall_minutes stops the run after the step that crosses it, then the run
    checkpoints and exports as at a normal end."""
    outcome = api.train(
        loaded(
            tmp_path,
            "train.max_num_steps=50",
            "train.max_wall_minutes=0.0001",
            "validation.enable=true",
            "validation.num_samples=4",
            "validation.batch_size=4",
            'validation.held_out_rewards=["jpeg_incompressibility"]',
        ),
        SHAPES,
    )
    assert outcome.result.steps == 1
    records = read_metrics(tmp_path / "metrics.jsonl")
    held = [r for r in records if "heldout/jpeg_incompressibility/jpeg_incompressibility" in r]
    assert [r["step"] for r in held] == [1]
    value = held[0]["heldout/jpeg_incompressibility/jpeg_incompressibility"]
    assert value > 0  # kilobytes of a JPEG q95: positive
    assert (tmp_path / "checkpoints" / "step_00000001").is_dir()
    assert (tmp_path / "export" / "pytorch_lora_weights.safetensors").is_file()


def test_sol_rl_preset_resume_equals_uninterrupted_bit_for_bit(tmp_path):
    """Inference copies are merged at set-up, before the checkpoint loads: a resume must re-merge them from the
    restored old adapter, or the first rollout after it samples from the set-up theta_old."""
    preset = ROOT / "sanarl" / "presets" / "tiny-shapes-nft-solrl.toml"
    small = [
        "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=16",
        "rollout.num_candidates=16",
        "rollout.reward_workers=0",
        "validation.enable=false",
        "logging.multi_modal_log_interval=0",
        "train.ema_enable=true",
    ]

    def run(out: Path, *extra: str):
        cfg = load_config(preset, [f"train.output_dir={out}", *small, *extra])
        return api.train(cfg, SHAPES)

    run(tmp_path / "a", "train.max_num_steps=1", "train.ckpt.save_freq=1")
    resumed = run(tmp_path / "a", "train.max_num_steps=2", "train.resume=true")
    straight = run(tmp_path / "b", "train.max_num_steps=2")
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and any(".old." in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    after = [read_metrics(d / "metrics.jsonl")[-1] for d in (tmp_path / "a", tmp_path / "b")]
    assert after[0]["reward/mean"] == after[1]["reward/mean"]
    assert after[0]["reward_preview_kept_mean"] == after[1]["reward_preview_kept_mean"]


def _quantized_copy(outcome) -> torch.nn.Module:
    """The int8 rollout copy of a run: naive_quant's only copy, sol_rl's preview."""
    rollouts = outcome.task.rollouts
    return (rollouts.preview_copy if rollouts.family == "sol_rl" else rollouts.full_copy).module


@pytest.mark.parametrize("family", ["naive_quant", "sol_rl"])
def test_quantized_rollout_copy_resume_equals_uninterrupted_bit_for_bit(tmp_path, monkeypatch, family):
    """The int8 rollout copy (naive_quant trains on its samples, sol_rl ranks its drafts with it) is built at set-up
    from the set-up weights and re-merged from the restored old adapter when the checkpoint loads; its int8 form is
    re-packed from the merged master weights on the next forward. A run interrupted after step 1 and resumed
    equals an uninterrupted 2-step run bit for bit: weights, EMA, optimizer state, step 2's metrics, and the copy's
    master and packed int8 weights. M = 8 drafts, K = 4 kept: the selection depends on the quantized samples."""
    record_compiles(monkeypatch)  # naive_quant compiles its copy; compile itself: test_compile.py
    overrides = [f"rollout.family={family}", "rollout.num_candidates=8", "rollout.preview_step=2", *INT8]

    def run(out: Path, *extra: str):
        return api.train(loaded(out, *overrides, *extra), SHAPES)

    run(tmp_path / "a", "train.max_num_steps=1", "train.ckpt.save_freq=1")
    resumed = run(tmp_path / "a", "train.max_num_steps=2", "train.resume=true")
    straight = run(tmp_path / "b", "train.max_num_steps=2")
    copies = [_quantized_copy(o) for o in (resumed, straight)]
    layers = [[m for m in c.modules() if isinstance(m, Int8DynamicLinear)] for c in copies]
    assert layers[0] and len(layers[0]) == len(layers[1])  # the int8 backend really ran
    for ours, theirs in zip(*layers, strict=True):
        assert torch.equal(ours.weight, theirs.weight)
        (kind, packed), (_, packed_straight) = ours.packed(), theirs.packed()
        if kind == "emulated":
            assert all(torch.equal(x, y) for x, y in zip(packed, packed_straight, strict=True))
        else:
            unpacked = [torch.ops.quantized.linear_unpack(p)[0].int_repr() for p in (packed, packed_straight)]
            assert torch.equal(*unpacked)
    last = [d / "checkpoints" / "step_00000002" for d in (tmp_path / "a", tmp_path / "b")]
    for group in ("model", "ema"):
        a, b = (load_file(d / f"{group}.safetensors") for d in last)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), group
    states = [torch.load(d / "state.pt", weights_only=True)["optimizer"]["state"] for d in last]
    assert all(
        torch.equal(x, y) for k in states[0] for x, y in zip(*(s[k].values() for s in states), strict=True)
    )
    after = [read_metrics(d.parents[1] / "metrics.jsonl")[-1] for d in last]
    assert after[0]["step"] == after[1]["step"] == 2
    clocks = [
        k
        for k in after[1]
        if k in ("samples_per_s", "elapsed_s") or any(p.startswith("time") for p in k.split("/"))
    ]
    same = [k for k in after[1] if k not in clocks]
    assert {k: after[0][k] for k in same} == {k: after[1][k] for k in same}


def test_decay_type_3_moves_the_old_adapter_by_sol_rls_custom_ramp(tmp_path):
    """Sol-RL's decay type 3 through a run: after optimizer step k, d = min(k value / step, value)."""
    api.train(
        loaded(tmp_path, "train.max_num_steps=3", "policy.diffusers.weight_copy_decay_type=3",
               "policy.diffusers.custom_decay_step=2", "policy.diffusers.custom_decay_value=0.6"),
        SHAPES,
    )  # fmt: skip
    decays = [r["old_decay"] for r in read_metrics(tmp_path / "metrics.jsonl") if "old_decay" in r]
    assert decays == pytest.approx([min(k * 0.6 / 2, 0.6) for k in (1, 2, 3)])  # 0.3, 0.6, 0.6


def test_unshifted_grid_samples_on_linspace(tmp_path):
    """`sample.sigma_grid = "uniform"` (Sol-RL's SANA sampler): the rollout latents are the Euler loop over
    linspace(1, 0, N + 1) from the seed's noise, whatever the model's flow shift."""
    from sanarl.core.samplers import initial_noise
    from sanarl.training.sampling import generate_latents

    rollouts = api.train(
        loaded(
            tmp_path, "policy.diffusers.sample.sigma_grid=uniform", "policy.diffusers.sample.flow_shift=3.0"
        ),
        SHAPES,
        dry_run=True,
    ).task.rollouts
    adapter, spec = rollouts.adapter, rollouts.spec
    cond = adapter.encode_prompts(["a red circle", "a red circle"])
    seeds = [5, 6]
    got = generate_latents(adapter, cond, seeds, spec).latents
    x, _ = initial_noise(adapter.latent_shape(spec.height, spec.width), seeds, device=adapter.device)
    levels = [1.0 - i / spec.num_steps for i in range(spec.num_steps + 1)]
    with torch.no_grad():
        for s, s_next in zip(levels[:-1], levels[1:], strict=True):
            v = adapter.velocity(x, torch.full((2,), s), cond).float()
            x = x + v * (s_next - s)
    torch.testing.assert_close(got, x, atol=1e-5, rtol=1e-5)
