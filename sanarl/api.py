"""Programmatic entry points (the CLI is a thin layer over these)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config import LoadedConfig, check_plugin, dump_toml, resolve_plugin
from sanarl.tasks.base import Task
from sanarl.tasks.runner import RunResult


@dataclass
class TrainOutcome:
    """The task (with its adapter and trained weights in memory) and what the run left on disk."""

    task: Task
    result: RunResult | None
    plan: list[tuple[str, str]]


def quiet_libraries() -> None:
    """Silence the per-component loading bars and notices of diffusers / transformers (sanarl shows its own)."""
    import warnings

    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*Expected types for.*")


def train(loaded: LoadedConfig, plugin_spec: str, *, dry_run: bool = False, on_plan=None) -> TrainOutcome:
    """Resolve the plugin, load the model, build the task and run it (or stop after the plan when dry_run)."""
    import torch
    from accelerate import Accelerator

    from sanarl.models import load_adapter
    from sanarl.tasks import task_class
    from sanarl.tasks.runner import MIXED_PRECISION, Runner, prepare_run_dir

    quiet_libraries()
    cfg = loaded.config
    plugin = resolve_plugin(plugin_spec)
    check_plugin(plugin)
    cls = task_class(cfg)
    acc = Accelerator(mixed_precision=MIXED_PRECISION[cfg.train.param_dtype], cpu=not torch.cuda.is_available())
    run_dir = prepare_run_dir(cfg.train.output_dir)
    if acc.is_main_process:
        (run_dir / "config.toml").write_text(dump_toml(cfg))
    torch.manual_seed(cfg.train.seed)
    adapter = load_adapter(cfg.policy, acc.device)
    task = cls(cfg, adapter, plugin, rank=acc.process_index, world=acc.num_processes)
    task.setup_model()
    plan = cls.describe(cfg, len(task.train_dataset), acc.num_processes)
    if on_plan is not None and acc.is_main_process:
        on_plan(plan, run_dir)
    if dry_run:
        return TrainOutcome(task, None, plan)
    return TrainOutcome(task, Runner(cfg, task, acc, run_dir).run(), plan)
