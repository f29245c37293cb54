"""Shared test setup: an isolated model cache (tiny pipelines build once per session), an isolated state folder (the
reward service's persistent Redis data) and no Hub access."""

from __future__ import annotations

import os
import socket

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist hands its workers the controller's COLUMNS; rich would freeze sanarl.ui's consoles at that width
    # when the test modules import it, and tests that set COLUMNS themselves (wide plan tables) would not be obeyed.
    os.environ.pop("COLUMNS", None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test.sh runs `-n auto --dist loadgroup`), a test file goes to one worker whole, so
    its module fixtures (tiny runs shared by many tests) are built once; files marked with one `xdist_group` (the
    `accelerate launch` tests, which share port 29500) go to one worker together."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Tiny pipelines are built into a per-session cache unless SANARL_CACHE points somewhere already."""
    os.environ.setdefault("SANARL_CACHE", str(tmp_path_factory.mktemp("sanarl-cache")))
    os.environ["XDG_STATE_HOME"] = str(
        tmp_path_factory.mktemp("state")
    )  # services started by tests keep queues here
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytest.mark.usefixtures("one_thread")`), restored afterwards: tiny models
    gain nothing from more, and on a shared 2-core box OpenMP's default spin-wait makes 2 threads up to ~30x slower
    than 1 whenever another process holds a core."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_metrics_plot(monkeypatch):
    """The run's metrics.png is not drawn (about 2 s of matplotlib per run; tests/integration/test_sft_runs.py tests
    it)."""
    import sanarl.training.tracking as tracking

    monkeypatch.setattr(tracking, "plot_metrics", lambda *args, **kwargs: None)


@pytest.fixture
def run_cli(capsys):
    """Run the sanarl CLI in-process: returns (exit code, stdout, stderr)."""
    from sanarl.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def refused(run_cli, tmp_path):
    """`refused(preset, plugin, overrides, needles)`: the CLI run exits 2 with every needle in its message and
    writes nothing (no run folder)."""

    def check(preset, plugin: str, overrides: list[str], needles: list[str]) -> None:
        args = ["--config", str(preset), plugin, "--set", f"train.output_dir={tmp_path / 'run'}"]
        for override in overrides:
            args += ["--set", override]
        code, _, err = run_cli(*args)
        message = " ".join(err.split())
        assert code == 2, err
        assert all(n in message for n in needles), message
        assert not (tmp_path / "run").exists()

    return check


@pytest.fixture
def network(monkeypatch):
    """The network is cut (DNS and connect raise) and the test fails if anything even tried to use it; yields the
    list of attempts (tests of download failures inspect it)."""
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield attempts
    assert attempts == [], f"a test tried to reach the network: {attempts}"
