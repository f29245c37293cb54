"""One SFT optimizer step through sanarl's Runner vs a bare PyTorch loop on the same model and batch.

- runner: `Runner.train_step(0)` on the task `sanarl.api.train` builds from `sanarl/presets/tiny-shapes-sft.toml`
  (shapes model, batch 64 in one micro-batch): data (render + collate + noise draw), prompt and image encoding,
  forward, loss, backward, grad clipping, AdamW, LR schedule, EMA, metrics. Step 0 every time, so every call sees
  the same batch.
- bare: the same step's tensors precomputed once (x_s, timestep, prompt embeddings, target v* = eps - x0); a copy of
  the same transformer; forward, MSE, backward, `torch.optim.AdamW` (same hyper-parameters), zero_grad.

Prints medians of interleaved repeats, the runner's own split (time_data / time_train from its metrics), and the
ratios runner / bare (target <= 1.15).

    python benchmarks/bench_runner_overhead.py [--repeats 15] [--threads 1] [--set train.ema_enable=false ...]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import _common
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml"
PLUGIN = "sanarl.datasets.shapes"
BATCH = 64


def build_runner(out_dir: str, extra: list[str]):
    """The Runner over the task `sanarl.api.train` builds (dry run: model loaded, nothing trained)."""
    import torch
    from accelerate import Accelerator

    from sanarl import api
    from sanarl.methods.config_loading import load_config
    from sanarl.training.run_folder.setup import MIXED_PRECISION
    from sanarl.training.runner import Runner

    overrides = [
        f"train.output_dir={out_dir}",
        f"train.train_batch_per_replica={BATCH}",
        f"train.train_policy.mini_batch={BATCH}",
        "validation.enable=false",
        *extra,
    ]
    loaded = load_config(PRESET, overrides)
    outcome = api.train(loaded, PLUGIN, dry_run=True)
    cfg = loaded.config
    acc = Accelerator(
        mixed_precision=MIXED_PRECISION[cfg.train.param_dtype], cpu=not torch.cuda.is_available()
    )
    return Runner(cfg, outcome.task, acc, Path(out_dir))


@torch.no_grad()
def bare_inputs(runner) -> dict[str, torch.Tensor]:
    """Step 0's batch as model-ready tensors: x_s [B,C,H,W], timestep [B], embeds [B,L,D], mask [B,L], target."""
    from sanarl.core.flow import interpolate, velocity_target
    from sanarl.core.timesteps import u_to_sigma
    from sanarl.training.data_order import step_generator

    task, adapter = runner.task, runner.task.adapter
    rng = step_generator(runner.cfg.train.seed, 0, 0)
    batch = task.micro_batches(0, rng)[0]
    x0 = adapter.encode_images(batch["image"])
    cond = adapter.encode_captions(batch["prompt"], batch["keep_caption"].tolist())
    s = u_to_sigma(batch["u"], task.shift(batch["image"])).to(x0.device)
    eps = batch["eps"].to(x0.device)
    return {
        "x_s": interpolate(x0, eps, s),
        "timestep": 1000.0 * s * adapter.transformer.config.timestep_scale,
        "embeds": cond.embeds,
        "mask": cond.mask,
        "target": velocity_target(x0, eps),
    }


def make_bare_step(runner, inputs: dict[str, torch.Tensor]):
    """A closure doing one bare optimizer step on a private copy of the transformer."""
    model = copy.deepcopy(runner.task.adapter.transformer).train().requires_grad_(True)
    t = runner.cfg.train
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=t.optm_lr,
        betas=tuple(t.optm_betas),
        eps=t.epsilon,
        weight_decay=t.optm_weight_decay,
        foreach=t.optm_impl == "foreach",
    )

    def step() -> float:
        v = model(
            inputs["x_s"],
            encoder_hidden_states=inputs["embeds"],
            encoder_attention_mask=inputs["mask"],
            timestep=inputs["timestep"],
            return_dict=False,
        )[0]
        loss = F.mse_loss(v, inputs["target"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0 = torch's default); see README"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra preset override")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    _common.quiet()
    with tempfile.TemporaryDirectory(prefix="sanarl-bench-") as tmp:
        runner = build_runner(tmp, args.overrides)
        bare = make_bare_step(runner, bare_inputs(runner))
        splits: list[dict[str, float]] = []
        times = _common.interleaved_medians(
            {"runner": lambda: splits.append(runner.train_step(0)), "bare": bare}, args.repeats, warmup=2
        )
    splits = splits[-args.repeats :]
    t = runner.cfg.train
    print(
        f"SFT step, shapes model, batch {BATCH} (one micro-batch); clip {t.optm_grad_norm_clip}, "
        f"EMA {t.ema_enable}, optimizer {t.optm_name}/{t.optm_impl}"
    )
    print(f"env: {_common.environment()}")
    print(_common.describe_times(times))
    data = _common.median([m["time_data"] for m in splits])
    train = _common.median([m["time_train"] for m in splits])
    bare_med = _common.median(times["bare"])
    print(f"  runner split: time_data {1e3 * data:.2f} ms, time_train {1e3 * train:.2f} ms (medians)")
    print(
        f"  ratio runner / bare = {_common.median(times['runner']) / bare_med:.3f} (whole step; target <= 1.15)"
    )
    print(f"  ratio runner time_train / bare = {train / bare_med:.3f} (data loading excluded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
