"""Progress of a run's steps on the console (rank 0), every `logging.log_freq` steps.

On a terminal: a rich bar (steps done, then step time, ETA and the step's loss / reward) redrawn only at each
report. Anywhere else (a file, nohup, Slurm, a pipe) a bar would show nothing until the end, so each report
is one plain line instead: `step 10/1500  loss=0.1  ...  1.23 s/step  eta 0:30:12`.

The step time is the mean over the steps since the previous report (validations and checkpoints included, as a
user waits for them); the ETA is the mean time per step since this process began training times the steps left.
"""

from __future__ import annotations

import time
from datetime import timedelta
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Column

SHOWN_METRICS = ("loss", "reward/mean", "grad_norm", "samples_per_s")
"""The metrics a progress report shows (those the step logged)."""


def short_metrics(metrics: dict[str, float]) -> str:
    """`loss=0.1234  reward/mean=0.5  ...` of the metrics in SHOWN_METRICS that a step logged."""
    return "  ".join(f"{k}={metrics[k]:.4g}" for k in SHOWN_METRICS if k in metrics)


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    return str(timedelta(seconds=round(max(0.0, seconds))))


class StepProgress:
    """The run's progress over steps `start`..`total`: `report(done, total, metrics)` after each step (it shows
    every `log_freq`-th and the last); shows nothing when not `enabled` (ranks other than 0)."""

    def __init__(self, console: Console, start: int, total: int, log_freq: int, enabled: bool = True) -> None:
        self.console, self.start, self.log_freq, self.enabled = console, start, log_freq, enabled
        self.began = self.last_time = time.monotonic()
        self.last_step = start
        self.bar: Progress | None = None
        if enabled and console.is_terminal:
            columns = (
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),  # wraps, never cut
            )
            self.bar = Progress(*columns, console=console, auto_refresh=False)
            self.job = self.bar.add_task("train", total=total, completed=start, info="")

    def __enter__(self) -> StepProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.stop()

    def timing(self, done: int, total: int) -> str:
        """`1.23 s/step  eta 0:30:12` at step `done` of `total`."""
        now = time.monotonic()
        per_step = (now - self.last_time) / max(1, done - self.last_step)
        mean = (now - self.began) / max(1, done - self.start)
        self.last_time, self.last_step = now, done
        return f"{per_step:.3g} s/step  eta {clock(mean * (total - done))}"

    def report(self, done: int, total: int, metrics: dict[str, float]) -> None:
        """After step `done` (of `total`, which a wall-clock limit may lower): show it when it is due."""
        if not self.enabled or (done % self.log_freq and done != total):
            return
        timing = self.timing(done, total)
        if self.bar is not None:
            info = (
                f"{timing}  {short_metrics(metrics)}"  # one column: a narrow terminal wraps it at the spaces
            )
            self.bar.update(self.job, completed=done, total=total, info=info)
            self.bar.refresh()
            return
        line = f"step {done}/{total}  {short_metrics(metrics)}  {timing}"
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)
