"""DiffusionNFT rollout benchmarks on the tiny shapes base, measured side by side in one run.

1. Sol-RL two-stage search vs naive scaling: both look at M = 4K drafts per prompt and keep K by best/worst;
   naive_scaling samples every draft at full steps, sol_rl previews them at `--preview-step` steps and regenerates
   only the K kept seeds at full steps. Prints the rollout time ratio (target <= 0.5) and the kept samples' mean
   reward of each (target: sol_rl within 5% of naive_scaling). The preview runs at `--preview-precision`
   (default int8: the CPU quantization backend, every eligible linear layer of the tiny model quantized, a real
   quantization error; bf16 = unquantized, fewer steps only).
2. Async reward overlap: the same diffusionnft rollout with scoring on a worker thread (the next prompt is sampled
   while the previous one is scored) vs strictly sequential scoring, with the real `shapes` reward and with a
   simulated slow reward (a fixed delay per call, like a remote reward service).

    python benchmarks/bench_nft_rollout.py [--prompts 8] [--repeats 3] [--preview-step 2] [--preview-precision int8]
        [--only search|overlap]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from sanarl import api
from sanarl.methods.config_loading import load_config
from sanarl.methods.group_rl.rollout import group_seeds
from sanarl.rewards.base import Reward
from sanarl.rewards.registry import register

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "sanarl" / "presets" / "tiny-shapes-nft.toml"


@register("bench_slow_shapes")
def _slow_shapes(delay_s: float = 0.25) -> Reward:
    """The shapes reward behind a fixed latency per call (a stand-in for a remote reward service)."""
    from sanarl.rewards.scorers.shapes import ShapesReward

    class SlowShapes(ShapesReward):
        name = "bench_slow_shapes"

        def _score(self, images, prompts, metadata):
            time.sleep(delay_s)
            return super()._score(images, prompts, metadata)

    return SlowShapes()


def engine_for(*overrides: str):
    loaded = load_config(PRESET, ["train.output_dir=/tmp/sanarl-bench-nft", *overrides])
    task = api.train(loaded, "sanarl.datasets.shapes", dry_run=True).task
    return task.rollouts, task


def prompts_for(task, count: int) -> tuple[list[str], list[dict]]:
    items = [task.train_dataset[i] for i in range(count)]
    return [it["prompt"] for it in items], [it["metadata"] for it in items]


def timed_rollout(rollouts, prompts, metas, m: int) -> tuple[float, float]:
    seeds = [group_seeds(7, 0, 0, p, m) for p in range(len(prompts))]
    start = time.perf_counter()
    groups, _ = rollouts.rollout(prompts, metas, seeds)
    elapsed = time.perf_counter() - start
    kept = torch.cat([g.reward.total for g in groups])
    return elapsed, float(kept.mean())


def search_benchmark(args) -> None:
    k, m = 8, 32
    common = [f"rollout.n_generation={k}", f"rollout.num_candidates={m}", "rollout.reward_workers=0"]
    naive, task = engine_for("rollout.family=naive_scaling", *common)
    sol, _ = engine_for(
        "rollout.family=sol_rl",
        f"rollout.preview_step={args.preview_step}",
        f"rollout.preview_precision={args.preview_precision}",
        "rollout.nvfp4_min_dim=0",
        *common,
    )
    prompts, metas = prompts_for(task, args.prompts)
    timed_rollout(naive, prompts[:1], metas[:1], m)  # warm-up
    timed_rollout(sol, prompts[:1], metas[:1], m)
    times = {"naive_scaling": [], "sol_rl": []}
    rewards = {}
    for _ in range(args.repeats):
        for name, rollouts in (("naive_scaling", naive), ("sol_rl", sol)):
            t, r = timed_rollout(rollouts, prompts, metas, m)
            times[name].append(t)
            rewards[name] = r
    med = {k_: statistics.median(v) for k_, v in times.items()}
    print(f"search: {args.prompts} prompts, M={m} drafts -> K={k} kept, full steps {naive.spec.num_steps}, "
          f"sol_rl preview {args.preview_step} steps ({args.preview_precision} preview copy)")  # fmt: skip
    print(f"  naive_scaling  {med['naive_scaling']:.2f} s   kept mean reward {rewards['naive_scaling']:.4f}")
    print(f"  sol_rl         {med['sol_rl']:.2f} s   kept mean reward {rewards['sol_rl']:.4f}")
    print(f"  time ratio sol_rl / naive_scaling = {med['sol_rl'] / med['naive_scaling']:.3f} (target <= 0.5)")
    print(
        f"  reward ratio sol_rl / naive_scaling = {rewards['sol_rl'] / rewards['naive_scaling']:.3f} (target >= 0.95)"
    )


def overlap_benchmark(args) -> None:
    for reward in ("shapes", "bench_slow_shapes"):
        base = [f"train.train_policy.remote_reward.reward_fns.0.name={reward}"]
        sync, task = engine_for("rollout.reward_workers=0", *base)
        pooled, _ = engine_for("rollout.reward_workers=1", *base)
        prompts, metas = prompts_for(task, args.prompts)
        timed_rollout(sync, prompts[:1], metas[:1], 8)
        timed_rollout(pooled, prompts[:1], metas[:1], 8)
        t_sync, t_pool = [], []
        for _ in range(args.repeats):
            t_sync.append(timed_rollout(sync, prompts, metas, 8)[0])
            t_pool.append(timed_rollout(pooled, prompts, metas, 8)[0])
        a, b = statistics.median(t_sync), statistics.median(t_pool)
        print(f"overlap ({reward}): sequential {a:.2f} s, overlapped {b:.2f} s, ratio {b / a:.3f}")
        pooled.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preview-step", type=int, default=2)
    parser.add_argument(
        "--preview-precision", default="int8", choices=("int8", "auto", "fp8", "nvfp4", "bf16")
    )
    parser.add_argument(
        "--only", choices=("search", "overlap"), default=None, help="run one of the two parts"
    )
    args = parser.parse_args()
    if args.only in (None, "search"):
        search_benchmark(args)
    if args.only in (None, "overlap"):
        overlap_benchmark(args)


if __name__ == "__main__":
    main()
