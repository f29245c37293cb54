"""`python -m sanarl.tools.gpu_check`: refuses CPU without --allow-cpu (exit 2), runs every check on CPU with it,
reports a failing check with exit 1, and prints one parseable line per check."""

from __future__ import annotations

import re

import pytest
import torch

from sanarl.tools import gpu_check

pytestmark = pytest.mark.slow


def test_format_line_is_one_parseable_line():
    line = gpu_check.format_line("PASS", "nft", {"s": 12.345, "images/s": 4.0, "peak_GiB": 0.5})
    assert line == "PASS  nft            s=12.3  images/s=4  peak_GiB=0.5"
    assert gpu_check.format_line("SKIP", "compile", {}, "why") == "SKIP  compile          (why)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_refuses_cpu_without_allow_cpu(capsys):
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--allow-cpu" in err


def test_a_failing_check_is_reported_and_exits_1(monkeypatch, capsys):
    broken = gpu_check.Check("broken", "tiny-shapes-sft", "no_such_plugin_module", [], [])
    monkeypatch.setattr(gpu_check, "checks", lambda: [broken])
    assert gpu_check.main(["--allow-cpu"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^FAIL  broken .*PluginError", out, re.M) and "FAILED: 1 check(s) failed" in out


def test_allow_cpu_runs_every_check(capsys):
    assert gpu_check.main(["--allow-cpu"]) == 0
    out = capsys.readouterr().out
    lines = {
        m.group(2): (m.group(1), m.group(3))
        for m in re.finditer(r"^(PASS|SKIP|FAIL)\s+(\S+)\s*(.*)$", out, re.M)
    }
    assert set(lines) == {"sft", "compile", "nft", "soar", "sol_rl_bf16"}
    assert lines["compile"][0] == "SKIP"
    for name in ("sft", "nft", "soar", "sol_rl_bf16"):
        status, values = lines[name]
        numbers = dict(re.findall(r"(\S+)=([0-9.e+-]+)", values))
        assert status == "PASS" and float(numbers["steps/s"]) > 0 and float(numbers["peak_GiB"]) > 0
    for name in ("nft", "sol_rl_bf16"):  # rollouts report images/s
        assert float(dict(re.findall(r"(\S+)=([0-9.e+-]+)", lines[name][1]))["images/s"]) > 0
