"""One training iteration of sanarl against the references' own training loops, on the same model and work.

Pairs (each: sanarl's preset scaled down to the work, and the reference's loop, on one tiny SD3.5-M folder):
- `grpo`: flow_grpo's `scripts/train_sd3_fast.py` (Flow-GRPO-Fast: SDE window, CFG in training, two optimizer
  steps per rollout) against `sd35m-grpo` with the same window (`--flow-grpo DIR`);
- `nft`: DiffusionNFT's `scripts/train_nft_sd3.py` (deterministic DPM-Solver++ 2M rollouts without CFG, old /
  current / reference forwards, one optimizer step per rollout, old-policy decay copy) against `sd35m-nft`
  (`--diffusion-nft DIR`);
- `ff-grpo`, `ff-nft`: Flow-Factory's `GRPOTrainer` and `DiffusionNFTTrainer` on its SD3.5 adapter against
  `sd35m-grpo` / `sd35m-nft` (`--flow-factory DIR`; benchmarks/_peer_flow_factory.py says what it sets).

The references run from the checkouts given (a temporary copy of their package is imported; the reference side's
docstrings in benchmarks/_peer_flow_grpo.py, _peer_diffusion_nft.py and _peer_flow_factory.py say which of their modules are driven and
what of their script is left out); without a directory the pair runs sanarl's side only. Same on both sides: the
model folder (benchmarks/_peers.py), prompts, group size, sampling steps, size, trained levels, LoRA rank, sampling
batch, training micro-batch, optimizer steps per rollout, float32, the weight-free `jpeg_compressibility` reward,
one intra-op thread. Each side gets `--warmup` untimed iterations, then `--repeats` timed ones interleaved
(A B, B A, ...); medians per phase, in CPU seconds of the process (all threads; on a shared box the wall clock
mostly measures the wait for a core): rollout = sampling with text encoding and decoding; reward = inside the
reward calls; training = the rest (advantages, batches, forwards, backwards, optimizer, EMA); whole = the
iteration; wall = the iteration's wall-clock time. Peak memory: each
side again in a fresh process, one warm-up iteration, then the peak RSS of one iteration above the resident size
before it (the method of scripts/measure_capacity.py; `--no-memory` skips it).

`--sanarl-set KEY=VALUE` (repeatable) adds an override to sanarl's side after the pair's own, to measure an opt-in
switch against the same reference loop (e.g. `train.compile=true`: inductor on the trained forward, which moves
the numbers at rounding level); the report names it.

    python benchmarks/bench_references.py [--flow-grpo DIR] [--diffusion-nft DIR] [--flow-factory DIR]
        [--pairs grpo,nft,ff-grpo,ff-nft]
        [--prompts 2 --group 4 --steps 6 --size 64 --batch 4 --micro 4 --window 2 --rank 32]
        [--repeats 5 --warmup 1 --threads 1 --no-memory] [--sanarl-set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import _common
import torch
from _peers import Isolated, Side, Work, measure_child, peak_memory, save_model

PHASES = ("rollout", "reward", "training", "whole", "wall")
UPDATES = {"grpo": 2, "nft": 1, "ff-grpo": 2, "ff-nft": 1}
"""Optimizer steps per rollout: flow_grpo's SD3 configs, Flow-Factory's SD3.5 GRPO example and sd35m-grpo take 2;
DiffusionNFT's SD3 PickScore config, Flow-Factory's SD3.5 NFT example and sd35m-nft take 1."""
REFERENCE = {"grpo": "flow_grpo", "nft": "DiffusionNFT", "ff-grpo": "Flow-Factory", "ff-nft": "Flow-Factory"}
FLAG = {"grpo": "flow_grpo", "nft": "diffusion_nft", "ff-grpo": "flow_factory", "ff-nft": "flow_factory"}
"""The pair -> the argument holding its reference's checkout."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--flow-grpo", type=Path, help="a flow_grpo checkout (with scripts/train_sd3_fast.py)"
    )
    parser.add_argument("--diffusion-nft", type=Path, help="a DiffusionNFT checkout")
    parser.add_argument("--flow-factory", type=Path, help="a Flow-Factory checkout (with src/flow_factory)")
    parser.add_argument(
        "--pairs",
        help="comma-separated: grpo, nft, ff-grpo, ff-nft (default: grpo, nft, and the ff- pairs with --flow-factory)",
    )
    for name, default in (("prompts", 2), ("group", 4), ("steps", 6), ("size", 64), ("batch", 4)):
        parser.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("micro", 4), ("window", 2), ("rank", 32), ("repeats", 5), ("warmup", 1)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    parser.add_argument(
        "--sanarl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more override of sanarl's preset (repeatable), e.g. train.compile=true for the opt-in compile",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # "<pair>:<side>": one memory measurement
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def fail(message: str) -> None:
    """Bad arguments: the message on stderr, exit code 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def check(args: argparse.Namespace) -> list[str]:
    """The pairs to run; bad arguments end here with exit code 2 before anything loads."""
    if args.pairs is None:
        args.pairs = "grpo,nft" + (",ff-grpo,ff-nft" if args.flow_factory is not None else "")
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    bad = [p for p in pairs if p not in UPDATES]
    if bad or not pairs:
        fail(f"--pairs {args.pairs!r}: choose from grpo, nft, ff-grpo, ff-nft (comma-separated).")
    for flag, folder, need in (
        ("--flow-grpo", args.flow_grpo, "scripts/train_sd3_fast.py"),
        ("--diffusion-nft", args.diffusion_nft, "scripts/train_nft_sd3.py"),
        ("--flow-factory", args.flow_factory, "src/flow_factory/trainers/nft.py"),
    ):
        if folder is not None and not (folder / need).is_file():
            fail(f"{flag} {folder}: no {need} there; pass the root of that repository's checkout.")
    check_sanarl_settings(args.sanarl_set, pairs)
    if args.samples % args.batch or args.samples % args.micro:
        fail(f"--batch {args.batch} and --micro {args.micro} must divide the {args.samples} samples.")
    grpo = [p for p in pairs if p.endswith("grpo")]
    if grpo and args.samples // args.micro < UPDATES["grpo"]:
        fail(f"the grpo pairs take {UPDATES['grpo']} optimizer steps per rollout: --micro {args.micro} must leave "
             f"at least {UPDATES['grpo']} micro-batches of the {args.samples} samples.")  # fmt: skip
    if args.flow_factory is not None and any(p.startswith("ff-") for p in pairs) and args.batch != args.micro:
        fail(f"the ff- pairs need --batch {args.batch} = --micro {args.micro}: Flow-Factory samples and trains "
             "in batches of one size (per_device_batch_size).")  # fmt: skip
    if args.flow_grpo is not None and "grpo" in pairs:
        check_flow_grpo(args)
    if grpo and args.window >= args.steps:
        fail(f"--window {args.window} must be below --steps {args.steps}.")
    return pairs


def check_sanarl_settings(settings: list[str], pairs: list[str]) -> None:
    """`--sanarl-set` overrides read against each pair's preset as `sanarl --set` reads them (exit code 2 naming
    the key when one is malformed or unknown)."""
    if not settings:
        return
    from _peer_sanarl import PRESETS

    from sanarl.config.presets import resolve_preset_path
    from sanarl.errors import ConfigError
    from sanarl.methods.config_loading import load_config

    for preset in sorted({PRESETS[pair] for pair in pairs}):
        try:
            load_config(resolve_preset_path(preset), settings)
        except ConfigError as exc:
            fail(f"--sanarl-set: {exc}")


def check_flow_grpo(args: argparse.Namespace) -> None:
    """flow_grpo's script trains in batches of its sampling batch (its SD3 configs: train.batch_size =
    sample.train_batch_size) and steps the optimizer every num_batches_per_epoch / 2 of them (its configs assert
    an even num_batches_per_epoch): the grpo pair needs --micro = --batch and an even count of sampling batches."""
    updates, batches = UPDATES["grpo"], args.samples // args.batch
    if args.micro == args.batch and batches % updates == 0:
        return
    fix = (f"e.g. --batch {args.samples // updates} --micro {args.samples // updates}" if args.samples % updates == 0
           else f"--prompts x --group (here {args.samples}) must be a multiple of {updates}")  # fmt: skip
    fail(f"the grpo pair with --flow-grpo needs --micro {args.micro} = --batch {args.batch} and a multiple of "
         f"{updates} sampling batches (here {batches}): flow_grpo's script trains in batches of its sampling batch "
         f"and steps its optimizer every num_batches_per_epoch / {updates} of them; {fix}.")  # fmt: skip


def work_for(args: argparse.Namespace, pair: str) -> Work:
    return Work(
        prompts=args.prompts,
        group=args.group,
        steps=args.steps,
        size=args.size,
        batch=args.batch,
        micro=args.micro,
        updates=UPDATES[pair],
        window=args.window,
        rank=args.rank,
    )


def build_side(pair: str, side: str, work: Work, args: argparse.Namespace, scratch: Path) -> Side:
    """sanarl's or the reference's side of `pair` on `work` (model and prompt files under `scratch`), on its own
    accelerate gradient state: the other side's Accelerator does not scale its loss or skip its optimizer step."""
    return Isolated(lambda: _build_side(pair, side, work, args, scratch))


def _build_side(pair: str, side: str, work: Work, args: argparse.Namespace, scratch: Path) -> Side:
    model = save_model(scratch / "tiny-sd35m")
    if side == "sanarl":
        from _peer_sanarl import SanarlSide

        prompts = scratch / "prompts.txt"
        prompts.write_text("\n".join(work.prompt_list()) + "\n")
        return SanarlSide(pair, work, model, prompts, scratch / f"out-{pair}", tuple(args.sanarl_set))
    if pair == "grpo":
        from _peer_flow_grpo import FlowGrpoSide

        return FlowGrpoSide(args.flow_grpo, work, model, scratch)
    if pair.startswith("ff-"):
        from _peer_flow_factory import FlowFactorySide

        return FlowFactorySide(args.flow_factory, pair[3:], work, model, scratch)
    from _peer_diffusion_nft import DiffusionNftSide

    return DiffusionNftSide(args.diffusion_nft, work, model, scratch)


def time_pair(sides: list[Side], args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Warm-up, then interleaved timed iterations; per side, per phase, the list of seconds."""
    for side in sides:
        for _ in range(args.warmup):
            side.iteration()
    times = {side.name: {phase: [] for phase in PHASES} for side in sides}
    for i in range(args.repeats):
        for side in sides if i % 2 == 0 else sides[::-1]:
            for phase, seconds in side.iteration().items():
                times[side.name][phase].append(seconds)
    return times


def child_argv(args: argparse.Namespace, pair: str, side: str, work: Work, scratch: Path) -> list[str]:
    argv = ["--child", f"{pair}:{side}", "--work", work.to_json(), "--scratch", str(scratch)]
    argv += ["--threads", str(args.threads or 1)]
    argv += [f"--sanarl-set={setting}" for setting in args.sanarl_set]
    for flag, folder in (
        ("--flow-grpo", args.flow_grpo),
        ("--diffusion-nft", args.diffusion_nft),
        ("--flow-factory", args.flow_factory),
    ):
        if folder is not None:
            argv += [flag, str(folder)]
    return argv


def report(pair: str, times: dict, memory: dict, patched: list[str], work: Work, extra: list[str]) -> None:
    ref = REFERENCE[pair]
    print(f"\n== pair {pair}: sanarl {'sd35m-' + pair.removeprefix('ff-')} vs {ref} ==")
    if extra:
        print("sanarl's preset also set: " + ", ".join(extra))
    print(
        f"work: {work.prompts} prompts x {work.group}, {work.steps} steps, {work.size} px, sample batch "
        f"{work.batch}, micro-batch {work.micro}, {work.updates} optimizer step(s), LoRA r {work.rank}"
        + (f", SDE window {work.window}" if pair.endswith("grpo") else "")
    )
    for name, phases in times.items():
        cells = "  ".join(f"{p} {1e3 * _common.median(v):8.1f} ms" for p, v in phases.items())
        print(f"  {name:<12s} {cells}   (n={len(phases['whole'])})")
    for name, peak in memory.items():
        print(f"  {name:<12s} peak memory of an iteration {peak / 2**20:8.1f} MiB")
    if ref not in times:
        print(f"  ({ref} not given: sanarl's side only)")
        return
    print(
        f"  {ref} patched: "
        + ("; ".join(patched) if patched else "nothing (no CUDA-only call in the modules used)")
    )
    for phase in PHASES:
        ratio = _common.median(times["sanarl"][phase]) / max(_common.median(times[ref][phase]), 1e-12)
        print(f"  [{pair}] ratio sanarl / {ref}, {phase}: {ratio:.3f}")
    if ref in memory:  # a peak at or below the resident size (tiny work) has no meaningful ratio
        ratio = f"{memory['sanarl'] / memory[ref]:.3f}" if memory[ref] > 0 else "n/a (reference peak <= 0)"
        print(f"  [{pair}] ratio sanarl / {ref}, peak memory: {ratio}")


def run_pair(pair: str, args: argparse.Namespace, scratch: Path) -> None:
    work = work_for(args, pair)
    names = ["sanarl"] + ([REFERENCE[pair]] if getattr(args, FLAG[pair]) else [])
    sides = [build_side(pair, "sanarl" if n == "sanarl" else "reference", work, args, scratch) for n in names]
    times = time_pair(sides, args)
    memory = {}
    if not args.no_memory:
        for name in names:
            side = "sanarl" if name == "sanarl" else "reference"
            memory[name] = peak_memory(child_argv(args, pair, side, work, scratch))["peak"]
    report(pair, times, memory, [] if len(sides) == 1 else sides[1].patched, work, args.sanarl_set)


def run_child(args: argparse.Namespace) -> int:
    import json

    pair, side = args.child.split(":")
    built = build_side(pair, side, Work.from_json(args.work), args, args.scratch)
    print("MEASURED " + json.dumps(measure_child(built)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.samples = args.prompts * args.group
    if args.threads:
        torch.set_num_threads(args.threads)
    _common.quiet()
    if args.child:
        return run_child(args)
    pairs = check(args)
    print(f"env: {_common.environment()}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="sanarl-bench-refs-") as tmp:
        for pair in pairs:
            run_pair(pair, args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
