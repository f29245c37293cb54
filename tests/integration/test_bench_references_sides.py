"""The two sides of a `benchmarks/bench_references.py` pair run in one process, and accelerate keeps one
gradient-accumulation state per process (`GradientState`): the accumulation count that every Accelerator's
`backward` divides the loss by, set by the Accelerator built last, and `sync_gradients`, without which a prepared
optimizer skips its step. flow_grpo's side builds its Accelerator with `gradient_accumulation_steps x window`
after sanarl's side is built: with the default work sanarl's loss was divided by 2, and with one sampling batch for
two optimizer steps (`--batch 2 --micro 1` on 2 samples) by 0, a NaN gradient norm at sanarl's step 1.

Without the references' checkouts (CI), stand-ins build and step their Accelerators as flow_grpo's side does (one
with that 0, one with 2 that stops mid-accumulation), and sanarl's side, built and timed by the benchmark's own
`build_side` and `time_pair`, must train exactly as the same side does alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_references  # noqa: E402
from _peers import Isolated, Side  # noqa: E402

ARGV = ["--pairs", "grpo", "--prompts", "1", "--group", "2", "--steps", "4", "--size", "16", "--batch", "1",
        "--micro", "1", "--window", "2", "--rank", "2", "--repeats", "2", "--warmup", "0", "--no-memory"]  # fmt: skip
CLOCKS = ("time", "per_s")
"""Metrics that hold a clock reading (left out of the comparison)."""


class StandIn(Side):
    """What flow_grpo's side does to accelerate's state: an Accelerator with `steps` accumulated backward passes
    per update, and per iteration one backward inside `accumulate` (with 2 steps it stops mid-accumulation)."""

    def __init__(self, steps: int) -> None:
        from accelerate import Accelerator

        self.name, self.patched, self.seen = f"stand-in {steps}", [], []
        self.acc = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=steps)
        layer = torch.nn.Linear(2, 1)
        self.model, self.optimizer = self.acc.prepare(layer, torch.optim.SGD(layer.parameters(), lr=0.1))

    def iteration(self) -> dict[str, float]:
        self.seen.append(self.acc.gradient_accumulation_steps)
        if self.acc.gradient_accumulation_steps:  # 0 would divide by zero in `accumulate` itself
            with self.acc.accumulate(self.model):
                self.acc.backward(self.model(torch.ones(1, 2)).sum())
                self.optimizer.step()
                self.optimizer.zero_grad()
        return dict.fromkeys(bench_references.PHASES, 0.0)


def _numbers(metrics: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in step.items() if not any(c in k for c in CLOCKS)} for step in metrics]


def test_a_reference_sides_accelerator_does_not_reach_sanarls_side(tmp_path: Path):
    args = bench_references.parse(ARGV)
    args.samples = args.prompts * args.group
    assert bench_references.check(args) == ["grpo"]
    work = bench_references.work_for(args, "grpo")
    alone = bench_references.build_side("grpo", "sanarl", work, args, tmp_path)
    for _ in range(args.repeats):
        alone.iteration()
    paired = bench_references.build_side("grpo", "sanarl", work, args, tmp_path)
    stand_ins = [
        Isolated(lambda: StandIn(2)),
        Isolated(lambda: StandIn(0)),
    ]  # 0 built last: the NaN of issue 45
    times = bench_references.time_pair([paired, *stand_ins], args)
    assert [s.side.seen for s in stand_ins] == [[2, 2], [0, 0]]  # each ran on its own accumulation count
    assert len(times["sanarl"]["whole"]) == args.repeats
    expected = _numbers(alone.side.metrics)
    assert len(expected) == args.repeats * work.updates and all(m["grad_norm"] > 0 for m in expected)
    assert _numbers(paired.side.metrics) == expected
