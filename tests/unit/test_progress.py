"""The run's progress reports (sanarl/training/progress.py) on a fake clock: plain lines off a terminal, a bar on
one whose ETA comes from the steps' own times and which is drawn once per report, never on its own."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from sanarl.training import progress as progress_module
from sanarl.training.progress import StepProgress, clock


@pytest.fixture
def fake_clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    return now


def test_off_a_terminal_each_due_step_is_one_plain_line_with_step_time_and_eta(fake_clock):
    buffer = io.StringIO()
    with StepProgress(Console(file=buffer, width=40), start=0, total=100, log_freq=10) as progress:
        for done in range(1, 31):
            fake_clock[0] += 2.0 if done <= 10 else 4.0  # 2 s a step, then 4 s
            progress.report(done, 100, {"loss": 0.25, "reward/mean": 0.5, "lr": 1e-3})
    lines = buffer.getvalue().splitlines()
    assert (
        lines
        == [
            "step 10/100  loss=0.25  reward/mean=0.5  2 s/step  eta 0:03:00",  # 90 steps x 2 s
            "step 20/100  loss=0.25  reward/mean=0.5  4 s/step  eta 0:04:00",  # 80 x (60 s / 20)
            "step 30/100  loss=0.25  reward/mean=0.5  4 s/step  eta 0:03:53",  # 70 x (100 s / 30) = 233 s; never wrapped
        ]
    )


def test_a_resumed_run_times_only_its_own_steps_and_the_last_step_always_reports(fake_clock):
    buffer = io.StringIO()
    with StepProgress(Console(file=buffer), start=40, total=45, log_freq=10) as progress:
        for done in range(41, 46):
            fake_clock[0] += 3.0
            progress.report(done, 45, {"loss": 1.0})
    assert buffer.getvalue().splitlines() == ["step 45/45  loss=1  3 s/step  eta 0:00:00"]


def test_on_a_terminal_the_bar_shows_a_real_eta_and_draws_only_when_reporting(fake_clock):
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with StepProgress(console, start=0, total=1000, log_freq=50) as progress:
        assert progress.bar is not None and not progress.bar.live.auto_refresh
        for done in range(1, 101):
            fake_clock[0] += 1.5
            progress.report(done, 1000, {"loss": 0.5})
    frames = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buffer.getvalue())
    assert "eta 0:22:30" in frames  # step 100: 900 steps x 1.5 s
    assert "-:--:--" not in frames.split("100/1000")[-1]
    assert frames.count("train") <= 4  # the start, two reports and the stop: no redraws in between


def test_other_ranks_show_nothing():
    buffer = io.StringIO()
    with StepProgress(Console(file=buffer, force_terminal=True), 0, 10, 1, enabled=False) as progress:
        progress.report(10, 10, {"loss": 1.0})
    assert buffer.getvalue() == ""


def test_clock_reads_hours_minutes_seconds():
    assert (clock(0), clock(59.6), clock(3725), clock(-3)) == ("0:00:00", "0:01:00", "1:02:05", "0:00:00")
