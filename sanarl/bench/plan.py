"""What `sanarl bench shapes` runs by default, and the old full grid behind `--full`.

Default (`DEFAULT`): DiffusionNFT and Flow-GRPO-Fast, one seed each, 30 training minutes, the two side by side on
2 cores (`--jobs 2`), a held-out curve point every 5 minutes. Measured (docs/results.md, "The shapes world over 30
minutes"): 44 minutes of wall time; NFT +0.076 held-out strict, 3.6 paired standard errors, Flow-GRPO-Fast +0.020,
where the full grid's 4-minute runs (+0.014) stayed within one standard error. `FULL`: the session-3 grid, every
method x 3 seeds x 4 minutes (about an hour on 2 cores), final models only.
Explicit `--methods`, `--seeds`, `--budget-minutes` override either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sanarl.bench.methods import parse_methods
from sanarl.errors import UserError

EVAL_SEED = 2026
"""Seed of the held-out items (`sample_item("test", EVAL_SEED, i)`) and of their images (EVAL_SEED + i)."""


@dataclass(frozen=True)
class BenchPlan:
    """The (method, seed) runs of a bench and their training budget."""

    methods: tuple[str, ...]
    seeds: int
    budget_minutes: float
    curve_minutes: float = 0.0
    """Also evaluate a checkpoint every this many training minutes (0: the final models only)."""

    def runs(self) -> list[tuple[str, int]]:
        return [(m, s) for m in self.methods for s in range(self.seeds)]

    def training_wall_minutes(self, jobs: int) -> float:
        """Wall minutes of the training alone with `jobs` runs at a time (rounds x budget; evaluations extra)."""
        return math.ceil(len(self.runs()) / jobs) * self.budget_minutes


DEFAULT = BenchPlan(("nft", "grpo"), seeds=1, budget_minutes=30.0, curve_minutes=5.0)
FULL = BenchPlan(("nft", "nft-solrl", "grpo", "soar", "sft-more"), seeds=3, budget_minutes=4.0)


def resolve_plan(
    full: bool,
    methods: str | None,
    seeds: int | None,
    budget_minutes: float | None,
    curve_minutes: float | None = None,
) -> BenchPlan:
    """`DEFAULT` (or `FULL` with `--full`), with each explicitly given option replacing its value.

    Raises:
        ConfigError: an unknown method (methods.parse_methods); UserError: seeds < 1 or budget <= 0.
    """

    base = FULL if full else DEFAULT
    plan = BenchPlan(
        tuple(parse_methods(methods)) if methods is not None else base.methods,
        base.seeds if seeds is None else seeds,
        base.budget_minutes if budget_minutes is None else budget_minutes,
        base.curve_minutes if curve_minutes is None else curve_minutes,
    )
    if plan.seeds < 1 or not plan.budget_minutes > 0 or plan.curve_minutes < 0:
        raise UserError(
            f"`--seeds` must be >= 1, `--budget-minutes` > 0 and `--curve-minutes` >= 0 (got {plan.seeds}, "
            f"{plan.budget_minutes:g}, {plan.curve_minutes:g})."
        )
    return plan


def describe_plan(plan: BenchPlan, jobs: int) -> str:
    """One line: what runs and the training wall time it takes."""
    runs = len(plan.runs())
    return (
        f"{', '.join(plan.methods)} x {plan.seeds} seed(s) = {runs} run(s) of {plan.budget_minutes:g} training "
        f"minutes, {min(jobs, runs)} at a time: {plan.training_wall_minutes(jobs):g} minutes of training wall time "
        "plus the evaluations" + curve_text(plan)
    )


def curve_points(plan: BenchPlan) -> list[float]:
    """Training minutes of the curve points before the end (the timed checkpoints inside the budget)."""
    if plan.curve_minutes <= 0:
        return []
    count = math.ceil(plan.budget_minutes / plan.curve_minutes) - 1
    return [plan.curve_minutes * k for k in range(1, count + 1)]


def curve_text(plan: BenchPlan) -> str:
    """What the plan line says about the held-out curve: its points, or why there is none."""
    if plan.curve_minutes <= 0:
        return ""
    points = curve_points(plan)
    if not points:
        return (
            f" (no held-out curve point before the end: --curve-minutes {plan.curve_minutes:g} is not shorter than "
            f"the {plan.budget_minutes:g}-minute budget, so only the final models are evaluated; pass a smaller "
            "--curve-minutes for a curve)"
        )
    shown = ", ".join(f"{p:g}" for p in points) if len(points) <= 8 else f"every {plan.curve_minutes:g}"
    return f" (a held-out curve point at {shown} training minutes and at the end)"
