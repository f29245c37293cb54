"""Console output of `sanarl eval`: a progress bar over all images and the results table (rich)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table


class EvalProgress:
    """One bar per model: `start(label, total)` returns `advance(n)`."""

    def __init__(self, console: Console) -> None:
        self.bar = Progress(
            TextColumn("[bold]eval {task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            console=console,
        )  # fmt: skip

    def __enter__(self) -> EvalProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def start(self, label: str, total: int) -> Callable[[int], None]:
        job = self.bar.add_task(label, total=total)
        return lambda n: self.bar.advance(job, n)


def _fmt(mean: float, stderr: float) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:.4f} ± {stderr:.4f}"


def results_table(summary: dict[str, Any]) -> Table:
    """Rows: score keys (and GenEval overall / per-tag strict accuracy); columns: models, then delta vs the first."""
    models = summary["models"]
    labels = list(models)
    table = Table(title=f"sanarl eval: {summary['prompts']['n']} samples ({summary['prompts']['source']})",
                  title_justify="left")  # fmt: skip
    table.add_column("score", overflow="fold")  # narrow terminals wrap the cells, never cut them
    for label in labels:
        table.add_column(label, justify="right", overflow="fold")
    for label in labels[1:]:
        table.add_column(f"Δ {label}", justify="right", overflow="fold")
    keys = sorted({k for m in models.values() for k in m["scores"]})
    for key in keys:
        cells = [_fmt(m["scores"][key]["mean"], m["scores"][key]["stderr"]) if key in m["scores"] else "-"
                 for m in models.values()]  # fmt: skip
        for label in labels[1:]:
            d = summary["comparison"][label].get(key)
            cells.append(
                f"{d['delta']:+.4f} ± {d['stderr']:.4f}" if d and not math.isnan(d["delta"]) else "-"
            )
        table.add_row(key, *cells)
    for reward in sorted({r for m in models.values() for r in m["geneval"]}):
        parts = _parts(models, reward)
        for part in ("overall", "per_tag"):
            rows = [("", None)] if part == "overall" else [(t, t) for t in _tags(models, reward)]
            for name, tag in rows:
                cells = []
                for m in models.values():
                    acc = m["geneval"].get(reward, {})
                    entry = acc.get("overall", {}) if tag is None else acc.get("per_tag", {}).get(tag, {})
                    cells.append(" / ".join(f"{entry[k]:.4f}" for k in parts if k in entry) or "-")
                label = f"{reward} GenEval {'overall' if tag is None else name} ({' / '.join(parts)})"
                table.add_row(label, *cells, *["" for _ in labels[1:]])
    return table


def _tags(models: dict[str, Any], reward: str) -> list[str]:
    return sorted({t for m in models.values() for t in m["geneval"].get(reward, {}).get("per_tag", {})})


def _parts(models: dict[str, Any], reward: str) -> list[str]:
    """The accuracy kinds a reward's GenEval block holds, in the order strict, partial, exact."""
    held = {k for m in models.values() for k in m["geneval"].get(reward, {}).get("overall", {})}
    return [k for k in ("strict", "partial", "exact") if k in held]
