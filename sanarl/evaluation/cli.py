"""The `sanarl eval` command (registered on the tools app in sanarl/cli.py). Imports nothing heavy until it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from sanarl.config.presets import resolve_preset_path
from sanarl.errors import UserError
from sanarl.ui import console, guarded, out

Strs = list[str] | None


def eval_command(
    checkpoint: Annotated[
        Strs, typer.Option("--checkpoint", help="Run, checkpoint or export dir (repeatable).")
    ] = None,
    model: Annotated[Strs, typer.Option("--model", help="Model id or pipeline dir (repeatable).")] = None,
    prompts: Annotated[str | None, typer.Option(help="Prompt file: .txt or .jsonl (with metadata).")] = None,
    dataset: Annotated[
        str | None, typer.Option(help="shapes[:test], geneval:test, pickscore:test, ...")
    ] = None,
    rewards: Annotated[str, typer.Option(help="Comma-separated reward names, e.g. shapes,pickscore.")] = "",
    output: Annotated[str, typer.Option(help="Output directory.")] = "outputs/eval",
    config: Annotated[str | None, typer.Option("--config", "-c", help="Preset for model / sampler.")] = None,
    num: Annotated[
        int | None, typer.Option(help="Number of samples (default: all rows; shapes 512).")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Sampling steps (default: eval_num_steps).")] = None,
    guidance: Annotated[float | None, typer.Option(help="CFG weight (default: the config's).")] = None,
    seed: Annotated[int, typer.Option(help="Sample i uses seed + i.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Images generated and scored per batch.")] = 16,
    set_: Annotated[
        Strs, typer.Option("--set", metavar="KEY=VALUE", help="Config override key=value (repeatable).")
    ] = None,
    image_stats: Annotated[
        bool, typer.Option("--image-stats", help="Also report off-target image statistics.")
    ] = False,
    no_ema: Annotated[
        bool, typer.Option("--no-ema", help="Use a checkpoint's raw weights, not its EMA.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for bad input too.")] = False,
):
    """Generate with one or more models on the same prompts and seeds, score with rewards, write samples.jsonl,
    summary.json and grid.png (docs/eval.md). The first --model (else the first --checkpoint) is the reference."""

    args = dict(
        checkpoints=checkpoint or [], models=model or [], prompts=prompts, dataset=dataset, rewards=rewards,
        output=output, config=config, num=num, steps=steps, guidance=guidance, seed=seed, batch_size=batch_size,
        overrides=set_ or [], stats=image_stats, use_ema=not no_ema,
    )  # fmt: skip
    guarded(debug, lambda: _eval(**args))


def _eval(*, checkpoints, models, prompts, dataset, rewards, output, config, num, steps, guidance, seed,
          batch_size, overrides, stats, use_ema) -> None:  # fmt: skip
    from dataclasses import replace

    from sanarl.config import apply_overrides
    from sanarl.evaluation.console import EvalProgress, results_table
    from sanarl.evaluation.prompts import load_prompts
    from sanarl.evaluation.run import EvalSettings, run_eval
    from sanarl.evaluation.sources import resolve_checkpoint, resolve_model, unique_labels
    from sanarl.methods.config_loading import load_config

    if not checkpoints and not models:
        raise UserError("nothing to evaluate: give `--model ID` and/or `--checkpoint DIR` (each repeatable).")
    if batch_size < 1 or (steps is not None and steps < 1):
        raise UserError("`--batch-size` and `--steps` must be >= 1.")
    base = load_config(resolve_preset_path(config), overrides).config if config else None
    sources = [resolve_model(m, base) for m in models] + [resolve_checkpoint(c, base) for c in checkpoints]
    sources = unique_labels([replace(s, config=apply_overrides(s.config, overrides), use_ema=use_ema)
                             for s in sources])  # fmt: skip
    rows = load_prompts(prompts, dataset, num=num, seed=seed)
    settings = EvalSettings(steps, guidance, seed, batch_size, stats)
    with EvalProgress(console) as progress:
        summary = run_eval(
            sources, rows, rewards.split(","), output, settings, spec_config=base, progress=progress
        )
    summary.pop("_results", None)
    out.print(results_table(summary))
    out.print(f"wrote {output}/samples.jsonl, summary.json, grid.png")
