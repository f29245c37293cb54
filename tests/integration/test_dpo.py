"""Diffusion-DPO end to end on the tiny SANA (CPU; docs/algorithms.md, "Diffusion-DPO"; docs/dpo.md): both shipped
tiny presets from the command line, the trained loss and its gradients against the formula re-derived here from
the tensors the task used (LoRA with the base as reference, and a full fine-tune with its frozen copy), the online
pairs against the group's rewards, resume bit for bit, two processes, the printed plan and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.config.presets import resolve_preset_path
from sanarl.core.lora import adapter_parameters, adapters_disabled
from sanarl.methods.config_loading import load_config
from sanarl.methods.dpo.task import DPOOnlineTask, DPOTask
from sanarl.models.base import Cond
from sanarl.training.data_order import step_generator
from sanarl.training.tracking import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch_cli  # noqa: E402

OFFLINE, ONLINE = "tiny-shapes-dpo", "tiny-shapes-dpo-online"
PAIRS, SHAPES = "sanarl.datasets.shapes_pairs", "sanarl.datasets.shapes"
QUIET = ("validation.enable=false", "validation.val_before_train=false")
SMALL_OFFLINE = ("train.train_batch_per_replica=4", "train.train_policy.mini_batch=4")
SMALL_ONLINE = ("rollout.n_generation=4", "rollout.batch_size=8", "train.train_batch_per_replica=8",
                "train.train_policy.mini_batch=8", "rollout.reward_workers=0")  # fmt: skip
LOG2 = float(torch.log(torch.tensor(2.0)))


def _cli_run(out: Path, preset: str, plugin: str, *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "sanarl", "--config", preset, plugin]
    for override in (f"train.output_dir={out}", *QUIET, *extra):
        cmd += ["--set", override]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out.parent, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("dpo") / "run"
    return out, _cli_run(out, OFFLINE, PAIRS, "train.max_num_steps=3", "train.train_batch_per_replica=8",
                         "train.train_policy.mini_batch=4")  # fmt: skip


@pytest.fixture(scope="module")
def online_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("dpo-online") / "run"
    return out, _cli_run(out, ONLINE, SHAPES, "train.max_num_steps=2", *SMALL_ONLINE)


def test_the_offline_preset_trains_from_the_command_line_and_its_metrics_move(offline_run):
    out, records = offline_run
    assert [r["step"] for r in records] == [1, 2, 3]
    # step 1: the LoRA starts at the base (B = 0), so every pair is at log 2 with no margin
    assert records[0]["loss"] == pytest.approx(LOG2, rel=1e-6) and records[0]["reward_margin"] == 0.0
    assert records[0]["model_mse"] == pytest.approx(records[0]["ref_mse"], rel=1e-6)
    later = records[1:]
    assert all(r["loss"] != pytest.approx(LOG2, rel=1e-4) and r["reward_margin"] != 0.0 for r in later)
    assert all(0.0 <= r["implicit_acc"] <= 1.0 and r["grad_norm"] > 0 for r in records)
    assert (out / "export" / "pytorch_lora_weights.safetensors").is_file()


def test_the_online_preset_trains_from_the_command_line_and_its_metrics_move(online_run):
    out, records = online_run
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["dpo_num_pairs"] == 2.0 and r["reward/mean"] == r["reward/mean"] for r in records)
    assert all(r["dpo_adv_margin_mean"] >= 0 for r in records)  # chosen is the group's best
    assert records[0]["loss"] == pytest.approx(LOG2, rel=1e-6)
    assert (
        records[1]["loss"] != pytest.approx(LOG2, rel=1e-5)
        and records[1]["model_mse"] != records[1]["ref_mse"]
    )
    assert (out / "export" / "pytorch_lora_weights.safetensors").is_file()


def _built(out: Path, preset, plugin: str, *extra: str):
    loaded = load_config(preset, [f"train.output_dir={out}", *QUIET, *extra])
    return api.train(loaded, plugin, dry_run=True).task


def _nudge(module: torch.nn.Module, params) -> None:
    """Move the trained weights off the reference (seeded), so the loss is not at its log 2 start."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in params:
            p.add_(0.02 * torch.randn(p.shape, generator=gen))


def _loss_by_hand(task, x0_w, x0_l, eps, s, cond, reference) -> tuple[torch.Tensor, torch.Tensor]:
    """Diffusion-DPO on velocities (docs/algorithms.md): both latents at the pair's s with its eps, x_s = (1 - s) x0
    + s eps; err = mean (v - (eps - x0))^2 per sample, the policy's with gradient, the reference's (`reference()` a
    context yielding the module to run) without; inside = -beta/2 ((err_w - ref_w) - (err_l - ref_l)),
    L = mean log(1 + exp(-inside)). The chosen and rejected rows share one forward per model, as the task runs them
    (beta_dpo 5000 would otherwise scale the float32 rounding of differently batched forwards into the loss)."""
    beta, shape = task.view.dpo.beta_dpo, (-1,) + (1,) * (x0_w.ndim - 1)
    x0, noise, level = torch.cat([x0_w, x0_l]), torch.cat([eps, eps]), torch.cat([s, s])
    x = (1 - level.view(shape)) * x0 + level.view(shape) * noise
    both = Cond(*(None if t is None else torch.cat([t, t]) for t in (cond.embeds, cond.mask, cond.pooled)))

    def err(module=None):
        v = task.adapter.velocity(x, level, both, module)
        return ((v - (noise - x0)) ** 2).mean(dim=tuple(range(1, x0.ndim))).chunk(2)

    with torch.no_grad(), reference() as module:
        ref_w, ref_l = err(module)
    err_w, err_l = err()
    inside = -beta / 2 * ((err_w - ref_w) - (err_l - ref_l))
    return torch.log1p(torch.exp(-inside)).mean(), inside.detach()


def _grads(params) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def _check_offline_parity(task: DPOTask, params, reference) -> None:
    batch = task.micro_batches(0, step_generator(42, 0, 0))[0]
    loss, metrics = task.objective(batch, torch.Generator())
    loss.backward()
    got = _grads(params)
    adapter = task.adapter
    with torch.no_grad():  # the SFT data path: both images through the VAE; the level from u by the shift
        x0_w, x0_l = (
            adapter.encode_images(batch["chosen"]).float(),
            adapter.encode_images(batch["rejected"]).float(),
        )
    k = adapter.default_shift
    assert torch.allclose(batch["s"], k * batch["u"] / (1 + (k - 1) * batch["u"]))
    cond = adapter.encode_prompts(batch["prompt"])  # caption_dropout 0: every caption kept
    want, inside = _loss_by_hand(task, x0_w, x0_l, batch["eps"], batch["s"], cond, reference)
    want.backward()
    assert metrics["loss"] == pytest.approx(want.item(), rel=1e-5)
    assert metrics["implicit_acc"] == pytest.approx(float((inside > 0).float().mean()))
    assert metrics["reward_margin"] == pytest.approx(float(inside.mean()), rel=1e-4, abs=1e-6)
    assert 0 < metrics["implicit_acc"] < 1 or abs(metrics["reward_margin"]) > 0
    assert max(float(g.abs().max()) for g in got) > 1e-3  # the tolerance is far below the gradient's size
    for g, w in zip(got, _grads(params), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-6)


def test_offline_lora_loss_and_gradients_equal_the_formula_with_the_base_as_reference(tmp_path):
    task = _built(tmp_path / "run", OFFLINE, PAIRS, *SMALL_OFFLINE)
    assert type(task) is DPOTask and task.reference is None
    module = task.adapter.trainable_module()
    params = list(adapter_parameters(module, "default").values())
    _nudge(module, params)
    _check_offline_parity(task, params, lambda: adapters_disabled(module))


def test_a_full_fine_tune_keeps_a_frozen_copy_of_the_base_as_reference(tmp_path):
    text = resolve_preset_path(OFFLINE).read_text()
    start = text.index("[policy.lora]")
    preset = tmp_path / "full.toml"
    preset.write_text(text[:start] + text[text.index("\n[", start) + 1 :])
    task = _built(tmp_path / "run", preset, PAIRS, *SMALL_OFFLINE)
    module = task.adapter.trainable_module()
    base = {k: v.clone() for k, v in module.state_dict().items()}
    assert task.reference is not None and task.reference is not module
    assert not any(p.requires_grad for p in task.reference.parameters())
    params = [p for p in module.parameters() if p.requires_grad]
    _nudge(module, params)
    assert all(torch.equal(base[k], v) for k, v in task.reference.state_dict().items())  # still the base
    _check_offline_parity(task, params, lambda: nullcontext(task.reference))


def test_online_pairs_are_each_groups_best_and_worst_and_the_loss_is_the_formula(tmp_path):
    task = _built(tmp_path / "run", ONLINE, SHAPES, *SMALL_ONLINE)
    assert type(task) is DPOOnlineTask
    module = task.adapter.trainable_module()
    params = list(adapter_parameters(module, "default").values())
    _nudge(module, params)
    batches = task.micro_batches(0, step_generator(42, 0, 0))
    assert len(batches) == 1 and len(batches[0]["s"]) == 2  # 8 samples / K 4: two groups, one pair each
    batch = batches[0]
    for row, group in enumerate(task.last_groups):  # per-group advantages keep the rewards' order
        r = group.reward.total.tolist()
        best, worst = r.index(max(r)), r.index(min(r))
        assert torch.equal(batch["x0_w"][row], group.latents[best])
        assert torch.equal(batch["x0_l"][row], group.latents[worst])
        assert torch.equal(batch["cond"].embeds[row], group.cond.embeds[0])  # the group's prompt
    loss, metrics = task.objective(batch, torch.Generator())
    loss.backward()
    got = _grads(params)
    want, inside = _loss_by_hand(
        task,
        batch["x0_w"],
        batch["x0_l"],
        batch["eps"],
        batch["s"],
        batch["cond"],
        lambda: adapters_disabled(module),
    )
    (want * batch["weight"]).backward()
    assert batch["weight"] == 1.0 and metrics["loss"] == pytest.approx(want.item(), rel=1e-5)
    assert metrics["implicit_acc"] == pytest.approx(float((inside > 0).float().mean()))
    assert max(float(g.abs().max()) for g in got) > 1e-3  # the tolerance is far below the gradient's size
    for g, w in zip(got, _grads(params), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize(
    ("preset", "plugin", "small"), [(OFFLINE, PAIRS, SMALL_OFFLINE), (ONLINE, SHAPES, SMALL_ONLINE)]
)
def test_resume_equals_an_uninterrupted_run(tmp_path, preset, plugin, small):
    extra = (*QUIET, *small, "train.ckpt.save_freq=1", "train.ckpt.export_safetensors=false")

    def run(out: Path, *more: str):
        return api.train(load_config(preset, [f"train.output_dir={out}", *extra, *more]), plugin)

    run(tmp_path / "a", "train.max_num_steps=2")
    resumed = run(tmp_path / "a", "train.max_num_steps=3", "train.resume=true")
    straight = run(tmp_path / "b", "train.max_num_steps=3")
    a, b = resumed.task.state_tensors(), straight.task.state_tensors()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert ra[-1]["step"] == rb[-1]["step"] == 3 and ra[-1]["loss"] == rb[-1]["loss"] != LOG2


@pytest.mark.xdist_group("accelerate")
def test_online_dpo_runs_as_one_training_in_two_processes(tmp_path):
    run = tmp_path / "run"
    cli = ["--config", ONLINE, SHAPES]
    for override in (f"train.output_dir={run}", "train.max_num_steps=2", *QUIET, *SMALL_ONLINE,
                     "train.train_policy.mini_batch=4"):  # fmt: skip
        cli += ["--set", override]
    done = accelerate_launch_cli(["--multi_gpu", "--num_processes", "2"], cli, tmp_path, OMP_NUM_THREADS="1")
    assert done.stdout.count("sanarl plan") == 1 and "2 rank(s) = 1 prompts x 4 images" in done.stdout
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2] and records[1]["loss"] != pytest.approx(LOG2, rel=1e-5)


def test_the_plans_print_the_pairs_their_micro_batches_and_the_reference():
    cfg = load_config(resolve_preset_path("sd35m-dpo")).config
    rows = dict(DPOTask.describe(cfg, 1000, 8))
    assert rows["batch per step"] == "2048 pairs (train_batch_per_replica) / 8 rank(s) = 256 per rank"
    assert rows["levels"].endswith("beta_dpo 5000; reference a frozen copy of the transformer")
    cfg = load_config(resolve_preset_path("sd35m-dpo-online")).config
    rows = dict(DPOOnlineTask.describe(cfg, 1000, 8))
    assert rows["micro-batches"].startswith(
        "6 pairs per rank (each group's best and worst advantage) / 6 per"
    )
    assert rows["loss"] == "beta_dpo 100, reference the base (LoRA off)"


def _plugin_file(tmp_path: Path) -> Path:
    path = tmp_path / "half_pairs.py"
    path.write_text(
        "import torch\n\n"
        "def get_dataset(config):\n"
        "    return [{'prompt': 'a red circle', 'chosen': torch.zeros(3, 32, 32)} for _ in range(8)]\n"
    )
    return path


@pytest.mark.parametrize(
    ("preset", "plugin", "overrides", "needles"),
    [
        (OFFLINE, "half_pairs", [], ["half_pairs.py", "without a `rejected` image", "__getitem__"]),
        (OFFLINE, SHAPES, [], ["`sanarl.datasets.shapes`", "not preference pairs", "sanarl.datasets.shapes_pairs",
                               "type = 'grpo'"]),
        (OFFLINE, "sanarl.datasets.diffusion_nft", ["train.train_policy.dataset.name=pickscore"],
         ["sanarl.datasets.diffusion_nft", "preference pairs", "sanarl.datasets.preference_jsonl"]),
        (OFFLINE, "sanarl.datasets.preference_jsonl", ["train.train_policy.dataset.local_dir=BAD_JSONL"],
         ["bad.jsonl:2", "`label_0`"]),
        (OFFLINE, "sanarl.datasets.preference_jsonl", ["train.train_policy.dataset.local_dir=GONE_JSONL"],
         ["gone.jsonl:1", "`jpg_1`", "missing.png", "does not exist"]),
        (OFFLINE, PAIRS, ["train.train_policy.dpo.beta_dpo=0"], ["dpo.beta_dpo", "> 0"]),
        (ONLINE, SHAPES, ["train.train_policy.mini_batch=4"], ["mini_batch = 4", "multiple of 8"]),
        (ONLINE, SHAPES, ['rollout.family="sol_rl"', "rollout.num_candidates=16"], ["rollout.family", '"diffusionnft"']),
    ],
)  # fmt: skip
def test_bad_input_is_named_before_any_model_loads(refused, tmp_path, preset, plugin, overrides, needles):
    (tmp_path / "img.png").write_bytes(b"")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"caption": "a", "jpg_0": "img.png", "jpg_1": "img.png", "label_0": 1}\n{"caption": "b", '
                   '"jpg_0": "img.png", "jpg_1": "img.png"}\n')  # fmt: skip
    gone = tmp_path / "gone.jsonl"
    gone.write_text('{"caption": "a", "jpg_0": "img.png", "jpg_1": "missing.png", "label_0": 0}\n')
    plugin = str(_plugin_file(tmp_path)) if plugin == "half_pairs" else plugin
    overrides = [o.replace("BAD_JSONL", str(bad)).replace("GONE_JSONL", str(gone)) for o in overrides]
    refused(preset, plugin, [*QUIET, *overrides], needles)
