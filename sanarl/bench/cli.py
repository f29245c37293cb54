"""`sanarl bench ...` commands (registered on the tools app in sanarl/cli.py). Imports nothing heavy until run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sanarl.errors import UserError
from sanarl.ui import guarded, out

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Benchmarks (docs/shapes.md).",
)


@bench_app.command("shapes")
def shapes(
    budget_minutes: Annotated[
        float | None,
        typer.Option(help="Training wall-clock minutes per method and seed [default: 30; --full: 4]."),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option(help="Seeds per method (train.seed = 0..S-1) [default: 1; --full: 3].")
    ] = None,
    methods: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated methods [default: nft,grpo; --full: nft,nft-solrl,grpo,soar,sft-more; also: ddrl, grpo-guard, awm, dpo, dpo-online]."
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option("--full", help="The full grid: every method x 3 seeds x 4 minutes (about an hour)."),
    ] = False,
    curve_minutes: Annotated[
        float | None,
        typer.Option(
            help="Evaluate a checkpoint every M training minutes too (0: final only) [default: 5; --full: 0]."
        ),
    ] = None,
    plan_only: Annotated[
        bool, typer.Option("--plan", help="Print the runs and their time, run nothing.")
    ] = False,
    eval_: Annotated[int, typer.Option("--eval", help="Held-out samples per evaluation.")] = 512,
    eval_steps: Annotated[int, typer.Option(help="Sampling steps of the evaluation.")] = 20,
    output: Annotated[Path, typer.Option(help="Output directory.")] = Path("outputs/bench-shapes"),
    rebuild_base: Annotated[
        bool, typer.Option("--rebuild-base", help="Retrain the base from its recipe into <output>.")
    ] = False,
    base_steps: Annotated[int, typer.Option(help="Steps of --rebuild-base.")] = 3675,
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip finished method/seed runs (done.json).")
    ] = False,
    jobs: Annotated[
        int, typer.Option(help="Method runs at a time, each in its own process with cores / jobs threads.")
    ] = 2,
    set_: Annotated[
        list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="Extra override for every method.")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for bad input too.")] = False,
):
    """Post-train the tiny shapes base with each method for the same budget, evaluate all on the held-out split,
    write results.md / results.json / accuracy_vs_time.png / grids/ (docs/shapes.md, "The bench")."""

    def go() -> None:
        from sanarl.bench.plan import describe_plan, resolve_plan

        if min(eval_, eval_steps, jobs) < 1:
            raise UserError("`--eval`, `--eval-steps` and `--jobs` must be >= 1.")
        plan = resolve_plan(full, methods, seeds, budget_minutes, curve_minutes)
        out.print(f"bench plan: {describe_plan(plan, jobs)}")
        if plan_only:
            return
        from sanarl.bench.shapes import BenchOptions, run_bench

        opts = BenchOptions(
            output=output, methods=list(plan.methods), seeds=plan.seeds, budget_minutes=plan.budget_minutes,
            eval_num=eval_, eval_steps=eval_steps, resume=resume, rebuild_base=rebuild_base, base_steps=base_steps,
            extra_overrides=set_ or [], jobs=jobs, curve_minutes=plan.curve_minutes,
        )  # fmt: skip
        run_bench(opts, out)
        out.print(
            f"[bold green]done[/]: {output}/results.md, results.json, accuracy_vs_time.png, curves.png, grids/"
        )

    guarded(debug, go)
