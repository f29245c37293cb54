"""`sanarl bench shapes`: every post-training method from the same base, same budget, same held-out evaluation.

For each method (a preset, methods.py) and seed: `api.train` with `train.max_wall_minutes = budget`,
`train.seed = k`, `train.output_dir = <out>/<method>/seed<k>` (plus `train.max_num_steps` lifted so the budget binds,
validation off), then the newest checkpoint (EMA weights when held) is evaluated on the shapes held-out split: the
same `eval_num` prompts and seeds for every model, CFG-free Euler at `eval_steps` steps. With `curve_minutes` the
run also keeps a checkpoint every that many minutes and each is evaluated the same way (curves.py). `<out>/<method>/seed<k>/
done.json` marks a finished run (`--resume` skips it). report.py turns the records into the table, plot and grids.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from sanarl import api
from sanarl.bench.base_model import export_base, train_base
from sanarl.bench.curves import curve_overrides, evaluate_intermediate
from sanarl.bench.methods import METHODS, PLUGINS, rollout_cost
from sanarl.bench.plan import EVAL_SEED
from sanarl.bench.report import PAIRED_KEYS, write_report
from sanarl.config.presets import resolve_preset_path
from sanarl.evaluation.prompts import PromptSet, shapes_prompts
from sanarl.evaluation.run import EvalSettings, evaluate_source
from sanarl.evaluation.sources import ModelSource, load_source, resolve_checkpoint, resolve_model
from sanarl.methods.config_loading import load_config
from sanarl.rewards.held_out import build_rewards
from sanarl.training.sampling import GenerationSpec
from sanarl.training.tracking import read_metrics

BASE_MODEL = "sanarl-tiny:shapes-base"


@dataclass
class BenchOptions:
    """What `sanarl bench shapes` runs (CLI options)."""

    output: Path
    methods: list[str]
    seeds: int = 3
    budget_minutes: float = 4.0
    eval_num: int = 512
    eval_steps: int = 20
    batch_size: int = 64
    resume: bool = False
    rebuild_base: bool = False
    base_steps: int = 3675
    extra_overrides: list[str] = field(default_factory=list)
    jobs: int = 1
    """Method runs at a time, each in its own process with cpu_count // jobs torch threads (1: in this process)."""
    curve_minutes: float = 0.0
    """Evaluate a checkpoint every this many training minutes too (0: the final model only)."""


def eval_spec(adapter, size: int = 32, steps: int = 20) -> GenerationSpec:
    """The bench's one sampler for every model: CFG-free (w = 1), deterministic Euler, the model's default shift."""
    return GenerationSpec(
        num_steps=steps,
        guidance_scale=1.0,
        solver="euler",
        eta=0.0,
        shift=adapter.shift_for(size, size),
        height=size,
        width=size,
    )


def held_out(opts: BenchOptions) -> PromptSet:
    """The held-out prompts of the bench (shapes world test split, balanced tags)."""
    return shapes_prompts("test", opts.eval_num, EVAL_SEED)


def evaluate(source: ModelSource, rows: PromptSet, opts: BenchOptions) -> dict[str, Any]:
    """Held-out scores of one model: summary, per-sample strict / partial, image statistics, preview images."""
    adapter = load_source(source)
    settings = EvalSettings(seed=EVAL_SEED, batch_size=opts.batch_size, stats=True)
    spec = eval_spec(adapter, steps=opts.eval_steps)
    result = evaluate_source(adapter, source.label, rows, spec, build_rewards(["shapes"]), settings, None)
    per_sample = {k: result.scores[k] for k in PAIRED_KEYS if k in result.scores}
    return {
        "summary": result.summary,
        "seconds": result.seconds,
        "preview": result.preview,
        "per_sample": per_sample,
    }


def _curve_summary(source: ModelSource, rows: PromptSet, opts: BenchOptions) -> dict[str, Any]:
    """A curve point's evaluation summary (the same evaluation as a final model, per-sample scores left out)."""
    return evaluate(source, rows, opts)["summary"]


def _save_preview(record: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Keep the preview images on disk (preview.pt) so a resumed bench can still draw grids."""
    import torch

    preview = record.pop("preview", None)
    if preview is not None:
        torch.save(preview, run_dir / "preview.pt")
    return record


def run_base(opts: BenchOptions, rows: PromptSet, base_model: str, console: Console) -> dict[str, Any]:
    """Evaluate the base once (`<out>/base/done.json`)."""
    run_dir = opts.output / "base"
    done = run_dir / "done.json"
    if opts.resume and done.is_file():
        console.print("[dim]base: done (resume)[/]")
        return json.loads(done.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]base[/]: evaluating {base_model} on {len(rows)} held-out samples")
    record = {"method": "base", "seed": None, "model": base_model, "train_minutes": 0.0, "steps": 0,
              "rollout_images": 0, "reward_calls": 0, **evaluate(resolve_model(base_model), rows, opts)}  # fmt: skip
    record = _save_preview(record, run_dir)
    done.write_text(json.dumps(record, indent=2))
    return record


def train_overrides(opts: BenchOptions, run_dir: Path, seed: int, base_model: str) -> list[str]:
    """The `--set` overrides of one method run (see the module docstring)."""
    sets = [
        f"train.max_wall_minutes={opts.budget_minutes}",
        f"train.seed={seed}",
        f"train.output_dir={run_dir}",
        "train.max_num_steps=1000000000",
        "validation.enable=false",
        f"train.resume={'true' if opts.resume else 'false'}",
    ]
    if base_model != BASE_MODEL:
        sets.append(f"policy.model_name_or_path={base_model}")
    return sets + curve_overrides(opts.curve_minutes) + list(opts.extra_overrides)


def run_method(
    method: str, seed: int, opts: BenchOptions, rows: PromptSet, base_model: str, console: Console
) -> dict[str, Any]:
    """Train one (method, seed) within the budget and evaluate it; `done.json` holds the record."""

    run_dir = opts.output / method / f"seed{seed}"
    done = run_dir / "done.json"
    if opts.resume and done.is_file():
        console.print(f"[dim]{method} seed {seed}: done (resume)[/]")
        return json.loads(done.read_text())
    if not opts.resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    console.print(f"[bold]{method}[/] seed {seed}: training {opts.budget_minutes:g} min ({METHODS[method]})")
    loaded = load_config(
        resolve_preset_path(METHODS[method]), train_overrides(opts, run_dir, seed, base_model)
    )
    started = time.perf_counter()
    api.train(loaded, PLUGINS[method])
    wall = time.perf_counter() - started
    metrics = [
        r for r in read_metrics(run_dir / "metrics.jsonl") if "time_train" in r
    ]  # optimizer steps only
    steps = max((int(r["step"]) for r in metrics), default=0)
    images, calls = rollout_cost(loaded.config, steps)
    train_s = sum((r.get("time_data") or 0.0) + (r.get("time_train") or 0.0) for r in metrics)
    console.print(f"[bold]{method}[/] seed {seed}: {steps} steps; evaluating on {len(rows)} held-out samples")
    source = resolve_checkpoint(str(run_dir))
    record = {"method": method, "seed": seed, "preset": METHODS[method], "steps": steps,
              "train_minutes": train_s / 60, "wall_minutes": wall / 60, "rollout_images": images,
              "reward_calls": calls, "checkpoint": str(source.checkpoint), **evaluate(source, rows, opts)}  # fmt: skip
    if opts.curve_minutes > 0:
        record["curve"] = evaluate_intermediate(
            run_dir, steps, lambda ckpt: _curve_summary(resolve_checkpoint(str(ckpt)), rows, opts)
        )
    record = _save_preview(record, run_dir)
    done.write_text(json.dumps(record, indent=2))
    return record


def prepare_base(opts: BenchOptions, console: Console) -> str:
    """The base model id: the shipped one, or (`--rebuild-base`) a fresh build at `<out>/base-model`."""
    if not opts.rebuild_base:
        return BASE_MODEL

    target = opts.output / "base-model"
    if opts.resume and (target / "model_index.json").is_file():
        return str(target)
    console.print(f"[bold]rebuilding the base[/]: {opts.base_steps} steps of tiny-shapes-sft")
    run_dir = train_base(opts.output / "base-run", opts.base_steps)
    return str(export_base(run_dir, target))


def _run_method_job(
    method: str, seed: int, opts: BenchOptions, base_model: str, threads: int
) -> dict[str, Any]:
    """`run_method` in a worker process of `--jobs N` (its own console and `threads` torch threads)."""
    import torch

    torch.set_num_threads(threads)
    return run_method(method, seed, opts, held_out(opts), base_model, Console())


def run_all_methods(opts: BenchOptions, rows: PromptSet, base_model: str, console: Console) -> list[dict]:
    """Every (method, seed) record, in method-then-seed order; `opts.jobs` of them at a time."""
    import os

    pairs = [(m, s) for m in opts.methods for s in range(opts.seeds)]
    if opts.jobs <= 1:
        records = []
        for n, (method, seed) in enumerate(pairs, 1):
            console.print(f"[bold cyan]run {n}/{len(pairs)}[/]")
            records.append(run_method(method, seed, opts, rows, base_model, console))
        return records
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // opts.jobs)
    console.print(f"[bold cyan]{len(pairs)} runs[/], {opts.jobs} at a time, {threads} thread(s) each")
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=opts.jobs, mp_context=context) as pool:
        futures = [pool.submit(_run_method_job, m, s, opts, base_model, threads) for m, s in pairs]
        return [f.result() for f in futures]


def run_bench(opts: BenchOptions, console: Console | None = None) -> dict[str, Any]:
    """Run everything, write the report; returns results.json's content."""

    console = console or Console()
    opts.output.mkdir(parents=True, exist_ok=True)
    base_model = prepare_base(opts, console)
    rows = held_out(opts)
    records = [run_base(opts, rows, base_model, console)]
    records += run_all_methods(opts, rows, base_model, console)
    return write_report(opts, records, rows, console)
