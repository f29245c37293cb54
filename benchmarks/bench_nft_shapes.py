"""Does DiffusionNFT raise the shapes reward? Held-out reward of the tiny base before and after N iterations.

Runs `sanarl/presets/tiny-shapes-nft.toml` (or `--preset`) for `--steps` iterations, then scores the base and the trained
model (EMA weights, as exported) on the same held-out prompts and seeds, CFG-free like the rollouts, and prints
partial / strict judge scores, their standard errors and the wall time the training took.

    python benchmarks/bench_nft_shapes.py [--steps 40] [--eval 256] [--preset ...] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sanarl import api
from sanarl.evaluation import build_rewards, describe, generate_and_score, load_source, resolve_checkpoint
from sanarl.evaluation.prompts import shapes_prompts
from sanarl.methods.config_loading import load_config
from sanarl.models import load_adapter
from sanarl.training.sampling import GenerationSpec

ROOT = Path(__file__).resolve().parents[1]


def evaluate(adapter, cfg, count: int, seed: int = 1234) -> tuple[float, float, float, float]:
    """Mean partial and strict judge scores (with standard errors) over `count` held-out prompts (sanarl.evaluation,
    the code behind `sanarl eval`), sampled with the rollout settings (CFG-free)."""
    rows = shapes_prompts("test", count, seed)
    spec = GenerationSpec.from_sample_config(
        cfg.policy.diffusers.sample, adapter, cfg.policy.diffusers.inference_size, evaluation=False
    )
    seeds = [seed + i for i in range(count)]
    scores = generate_and_score(
        adapter, rows.prompts, rows.metadata, seeds, spec, build_rewards(["shapes"]), batch_size=64
    )
    partial, strict = describe(scores["shapes/partial"]), describe(scores["shapes/strict"])
    return partial["mean"], partial["stderr"], strict["mean"], strict["stderr"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default=str(ROOT / "sanarl" / "presets" / "tiny-shapes-nft.toml"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval", type=int, default=256)
    parser.add_argument("--set", action="append", default=[], help="extra preset override (repeatable)")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="sanarl-bench-nft-"))
    loaded = load_config(
        args.preset,
        [
            f"train.output_dir={out}",
            f"train.max_num_steps={args.steps}",
            "validation.enable=false",
            *args.set,
        ],
    )
    cfg = loaded.config
    base = load_adapter(cfg.policy)
    before = evaluate(base, cfg, args.eval)
    start = time.perf_counter()
    outcome = api.train(loaded, "sanarl.datasets.shapes")
    minutes = (time.perf_counter() - start) / 60
    # the base plus the exported LoRA (EMA weights), as `sanarl eval --checkpoint <run>/export` loads it
    trained = load_source(resolve_checkpoint(str(outcome.result.export_dir)))
    after = evaluate(trained, cfg, args.eval)
    print(f"DiffusionNFT on the tiny shapes base: {args.steps} iterations in {minutes:.1f} min ({out})")
    print(f"  held-out partial  {before[0]:.4f} +- {before[1]:.4f}  ->  {after[0]:.4f} +- {after[1]:.4f}")
    print(f"  held-out strict   {before[2]:.4f} +- {before[3]:.4f}  ->  {after[2]:.4f} +- {after[3]:.4f}")
    print(f"  ratio after / before (partial) = {after[0] / max(before[0], 1e-9):.3f}")


if __name__ == "__main__":
    main()
